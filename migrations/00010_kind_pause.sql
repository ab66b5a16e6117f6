-- +goose Up
-- Per-kind settings (package task, kind.go): a paused kind's tasks do not
-- start anywhere. A worker that reads an entry of a paused kind parks the
-- task instead of starting it: it stays QUEUED or RETRYING with
-- next_retry_at at the far-future mark 9999-12-31 (so neither a start nor
-- the rescuer takes it) and its entry is acknowledged; resuming the kind
-- gives every parked task of it a new outbox event, due at once.
CREATE TABLE ingest_kind (
    kind       text PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL
);

-- Who changed which kind's settings, and when (one row per change).
CREATE TABLE ingest_kind_change (
    id         bigserial PRIMARY KEY,
    kind       text NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now(),
    actor      text NOT NULL,
    paused     boolean NOT NULL,
    released   integer NOT NULL DEFAULT 0
);
CREATE INDEX ingest_kind_change_kind_idx ON ingest_kind_change (kind, id);

-- The parked tasks of a kind, for the resume (only parked rows are indexed).
CREATE INDEX ingest_task_parked_idx ON ingest_task (kind, id)
    WHERE next_retry_at = '9999-12-31 00:00:00+00';

-- +goose Down
-- Parked tasks become due again (their outbox events are gone with the
-- feature: the rescuer republishes them after its grace).
UPDATE ingest_task SET next_retry_at = NULL WHERE next_retry_at = '9999-12-31 00:00:00+00';
DROP INDEX ingest_task_parked_idx;
DROP TABLE ingest_kind_change;
DROP TABLE ingest_kind;
