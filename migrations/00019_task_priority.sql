-- +goose Up
-- Priorities (docs/FAIRNESS.md "Priorities"): a task's priority, 1 (the
-- highest) to 4. NULL is the default priority, 2: a task created without
-- one writes nothing more than before, and the relay publishes it to the
-- configured stream. In Redis mode a task of priority 1, 3 or 4 is
-- published to its own stream (the configured key with :p1, :p3 or :p4;
-- package stream names them), which the workers read before (p1) or after
-- (p3, p4) the default one.
--
-- Nullable without a default: only the catalog changes (no table rewrite,
-- the lock held for an instant). No index names it, so a task's updates
-- stay HOT (migration 00012). The CHECK is NOT VALID: existing rows hold
-- NULL, and new writes are checked. NULL and 2 mean the same; the
-- creators write the default as NULL.
ALTER TABLE ingest_task ADD COLUMN priority smallint;
ALTER TABLE ingest_task ADD CONSTRAINT ingest_task_priority_in_range
    CHECK (priority BETWEEN 1 AND 4) NOT VALID;
COMMENT ON COLUMN ingest_task.priority IS 'priority 1 (highest) to 4; NULL: the default, 2';

-- +goose Down
ALTER TABLE ingest_task DROP CONSTRAINT ingest_task_priority_in_range;
ALTER TABLE ingest_task DROP COLUMN priority;
