-- +goose Up
-- Pipelines (package task): what a task's handler returned, how far a
-- running task has come, and a notification when a task ends.
--
-- result: the JSON a handler returned with its success (at most the
-- worker's INGEST_RESULT_MAX_BYTES, checked before it is written), written
-- by the same statement that marks the task SUCCEEDED; NULL: none.
-- progress_percent, progress_message, progress_at: the latest progress
-- the running attempt reported (written at most once a second per task by
-- a library handler, or by POST /v1/tasks/{id}/progress), cleared when a
-- run starts and when a run goes back to waiting (a retry, a hand-back, a
-- redrive).
--
-- Nullable without a default: on PostgreSQL 11 and later only the catalog
-- changes (no table rewrite, the lock held for an instant). No index names
-- them, so writing them keeps a task's updates HOT (migration 00012). The
-- CHECKs are NOT VALID: existing rows hold NULL, and new writes are checked.
ALTER TABLE ingest_task
    ADD COLUMN result jsonb,
    ADD COLUMN progress_percent smallint,
    ADD COLUMN progress_message text,
    ADD COLUMN progress_at timestamptz;
ALTER TABLE ingest_task ADD CONSTRAINT ingest_task_progress_in_range
    CHECK (progress_percent BETWEEN 0 AND 100) NOT VALID;
ALTER TABLE ingest_task ADD CONSTRAINT ingest_task_progress_message_short
    CHECK (octet_length(progress_message) <= 1000) NOT VALID;
COMMENT ON COLUMN ingest_task.result IS 'the JSON result of the successful run; NULL: none';
COMMENT ON COLUMN ingest_task.progress_percent IS 'latest progress of the running attempt, 0-100; NULL: none reported';

-- Tasks that end (SUCCEEDED, DEAD, CANCELLED) are announced on the channel
-- ingest_task_done, delivered at commit: the ids of one statement's
-- terminal audit rows, comma-separated, 200 to a notification (under the
-- 8000-byte payload limit). Waiters (GET /v1/tasks/{id}?wait=) listen on
-- it. Every transition to a terminal state writes its audit row (package
-- task), so every path is covered: completions, takeovers, cancels.
-- A statement-level trigger with a transition table: one call per
-- statement, none per row, and no notification at all for statements
-- that end no task (starts, creations).
-- +goose StatementBegin
CREATE FUNCTION ingest_task_done_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ingest_task_done', string_agg(id::text, ','))
    FROM (SELECT task_id AS id, (row_number() OVER ()) / 200 AS chunk
          FROM new_rows WHERE to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) d
    GROUP BY chunk;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ingest_task_done_notify AFTER INSERT ON ingest_task_transition
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_task_done_notify();

-- +goose Down
DROP TRIGGER ingest_task_done_notify ON ingest_task_transition;
DROP FUNCTION ingest_task_done_notify();
ALTER TABLE ingest_task
    DROP CONSTRAINT ingest_task_progress_message_short,
    DROP CONSTRAINT ingest_task_progress_in_range,
    DROP COLUMN progress_at,
    DROP COLUMN progress_message,
    DROP COLUMN progress_percent,
    DROP COLUMN result;
