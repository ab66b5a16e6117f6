-- +goose Up
-- A parked task is marked by a column of its own, parked_at (package task,
-- kind.go): NULL while it is not parked, else when a worker parked it (its
-- kind paused, or at a concurrency or rate limit). Before this migration
-- the mark was next_retry_at = 9999-12-31, a time a run_at could also hold:
-- such a task counted as parked and a resume of its kind ran it at once.
-- next_retry_at now keeps the task's own due time.
ALTER TABLE ingest_task ADD COLUMN parked_at timestamptz;
COMMENT ON COLUMN ingest_task.parked_at IS 'when a worker parked the task (its kind paused or at a limit); NULL: not parked';

-- The tasks parked under the old mark. A parked task's entry was read and
-- acknowledged, so it has no unsent outbox row due at the mark; a task
-- created with run_at 9999-12-31 has one, and stays scheduled. A parked
-- task was due when it was parked: next_retry_at NULL (due now).
UPDATE ingest_task t SET parked_at = t.updated_at, next_retry_at = NULL
WHERE t.next_retry_at = '9999-12-31 00:00:00+00' AND t.status IN ('QUEUED', 'RETRYING')
  AND NOT EXISTS (SELECT 1 FROM outbox_event o WHERE o.task_id = t.id AND o.status IN ('NEW', 'RETRYING')
                  AND o.next_retry_at = '9999-12-31 00:00:00+00');

-- Only a waiting task is parked. NOT VALID: the rows before are the ones
-- the statement above wrote, all waiting.
ALTER TABLE ingest_task ADD CONSTRAINT ingest_task_parked_is_waiting
    CHECK (parked_at IS NULL OR status IN ('QUEUED', 'RETRYING')) NOT VALID;

-- A kind's parked tasks (only parked rows are indexed). The predicate names
-- parked_at alone, a column the start of a task does not change, so that
-- the start stays a HOT update (docs/ARCHITECTURE.md §3.5): the old
-- predicate named next_retry_at, which the start clears, and no start of
-- a retry or of a delayed task was HOT.
DROP INDEX ingest_task_parked_idx;
CREATE INDEX ingest_task_parked_idx ON ingest_task (kind, id) WHERE parked_at IS NOT NULL;

-- +goose Down
-- The parked tasks get the old mark back (found on the index, before it
-- goes).
UPDATE ingest_task SET next_retry_at = '9999-12-31 00:00:00+00' WHERE parked_at IS NOT NULL;
DROP INDEX ingest_task_parked_idx;
ALTER TABLE ingest_task DROP CONSTRAINT ingest_task_parked_is_waiting;
ALTER TABLE ingest_task DROP COLUMN parked_at;
CREATE INDEX ingest_task_parked_idx ON ingest_task (kind, id)
    WHERE next_retry_at = '9999-12-31 00:00:00+00';
