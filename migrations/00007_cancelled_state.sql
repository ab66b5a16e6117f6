-- +goose Up
-- A sixth, terminal state: CANCELLED (an operator cancelled the task). A
-- cancel of a RUNNING task is first a request, recorded in the row
-- (cancel_requested_at, cancel_reason, cancel_requested_by: the actor); the
-- worker running it cancels its handler, and the run's completion writes
-- CANCELLED. A request exists only on a RUNNING task and stays on the
-- CANCELLED task it became; a redrive clears it.
ALTER TABLE ingest_task
    DROP CONSTRAINT ingest_task_status_check,
    ADD CONSTRAINT ingest_task_status_check
        CHECK (status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD', 'CANCELLED')),
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancel_reason       text,
    ADD COLUMN cancel_requested_by text,
    ADD CONSTRAINT ingest_task_cancel_request_running
        CHECK (cancel_requested_at IS NULL OR status IN ('RUNNING', 'CANCELLED'));

ALTER TABLE ingest_task_transition
    DROP CONSTRAINT ingest_task_transition_from_status_check,
    ADD CONSTRAINT ingest_task_transition_from_status_check
        CHECK (from_status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD', 'CANCELLED')),
    DROP CONSTRAINT ingest_task_transition_to_status_check,
    ADD CONSTRAINT ingest_task_transition_to_status_check
        CHECK (to_status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD', 'CANCELLED'));

-- +goose Down
-- The old schema has no CANCELLED: cancelled tasks become DEAD (redrivable
-- like them), and their audit rows say DEAD.
UPDATE ingest_task SET status = 'DEAD' WHERE status = 'CANCELLED';
UPDATE ingest_task_transition SET to_status = 'DEAD' WHERE to_status = 'CANCELLED';
UPDATE ingest_task_transition SET from_status = 'DEAD' WHERE from_status = 'CANCELLED';
ALTER TABLE ingest_task
    DROP CONSTRAINT ingest_task_cancel_request_running,
    DROP COLUMN cancel_requested_at,
    DROP COLUMN cancel_reason,
    DROP COLUMN cancel_requested_by,
    DROP CONSTRAINT ingest_task_status_check,
    ADD CONSTRAINT ingest_task_status_check
        CHECK (status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD'));
ALTER TABLE ingest_task_transition
    DROP CONSTRAINT ingest_task_transition_from_status_check,
    ADD CONSTRAINT ingest_task_transition_from_status_check
        CHECK (from_status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD')),
    DROP CONSTRAINT ingest_task_transition_to_status_check,
    ADD CONSTRAINT ingest_task_transition_to_status_check
        CHECK (to_status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD'));
