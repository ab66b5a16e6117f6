-- +goose Up
-- Per-kind limits (package task, limit.go). concurrency: at most that many
-- tasks of the kind RUNNING under a live lease at once, across all
-- processes (0: no limit). rate_count per rate_period_ms: at most that many
-- starts of the kind in any window of that length (0: no limit). A start of
-- a limited kind locks its ingest_kind row, so the limits hold across
-- processes; a task that finds its kind at a limit is parked (as a paused
-- kind's tasks are) and released when a slot or a start frees.
ALTER TABLE ingest_kind
    ADD COLUMN concurrency    integer NOT NULL DEFAULT 0 CHECK (concurrency >= 0),
    ADD COLUMN rate_count     integer NOT NULL DEFAULT 0 CHECK (rate_count >= 0),
    ADD COLUMN rate_period_ms integer NOT NULL DEFAULT 1000 CHECK (rate_period_ms > 0),
    -- The kind's starts in the last rate period (and a margin), one
    -- element per start transaction: its time in rate_log and how many
    -- tasks it started in rate_log_n. What its rate limit counts.
    ADD COLUMN rate_log       timestamptz[] NOT NULL DEFAULT '{}',
    ADD COLUMN rate_log_n     integer[] NOT NULL DEFAULT '{}';

-- The settings after each change (NULL: not changed by it).
ALTER TABLE ingest_kind_change
    ALTER COLUMN paused DROP NOT NULL,
    ADD COLUMN concurrency integer,
    ADD COLUMN rate        text;

-- The slots of a concurrency-limited kind: a row is taken while its task
-- is RUNNING under a live lease, or for 10 s after reserved_at (a start
-- reserves the slot, then starts the task). The worker that records a
-- run's outcome deletes its row; a crashed worker's rows are deleted as
-- stale by the next start of the kind.
CREATE TABLE ingest_kind_slot (
    kind        text NOT NULL,
    task_id     uuid NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, task_id)
);

-- +goose Down
DROP TABLE ingest_kind_slot;
DELETE FROM ingest_kind_change WHERE paused IS NULL;
ALTER TABLE ingest_kind_change
    DROP COLUMN rate,
    DROP COLUMN concurrency,
    ALTER COLUMN paused SET NOT NULL;
ALTER TABLE ingest_kind
    DROP COLUMN rate_log_n,
    DROP COLUMN rate_log,
    DROP COLUMN rate_period_ms,
    DROP COLUMN rate_count,
    DROP COLUMN concurrency;
