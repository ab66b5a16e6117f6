-- +goose Up
-- When a task's current life began to be due (package task): the charts of
-- the dashboard measure a task's latency from it, not from created_at, so
-- that a task delayed by an hour does not show an hour of latency. Set at
-- creation to a delayed task's first due time (run_at, or created_at plus
-- delay_ms), to now() by a run-now and by a redrive (a redriven task starts
-- a new life); NULL: due at creation (most tasks: the insert stays small),
-- so latency runs from greatest(created_at, due_at).
--
-- Nullable without a default: on PostgreSQL 11 and later only the catalog
-- changes (no table rewrite, the lock held for an instant), however large
-- the table. Existing tasks keep NULL: their latency stays measured from
-- their creation, as before. No index names it, so it does not stop the
-- start of a task from being a HOT update (migration 00012).
ALTER TABLE ingest_task ADD COLUMN due_at timestamptz;
COMMENT ON COLUMN ingest_task.due_at IS 'when the task''s current life became due (a delayed creation, run-now, redrive); NULL: at its creation';

-- +goose Down
ALTER TABLE ingest_task DROP COLUMN due_at;
