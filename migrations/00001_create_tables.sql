-- +goose Up
-- ingest_task: the source of truth for every task (docs/ARCHITECTURE.md §3).
CREATE TABLE ingest_task (
    id              uuid        PRIMARY KEY,
    kind            text        NOT NULL CHECK (kind <> '' AND length(kind) <= 200),
    payload         jsonb       NOT NULL,
    payload_sha     text        NOT NULL,
    idempotency_key text        CHECK (idempotency_key <> ''),
    status          text        NOT NULL DEFAULT 'QUEUED'
                                CHECK (status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD')),
    attempt_count   int         NOT NULL DEFAULT 0,
    max_attempts    int         NOT NULL CHECK (max_attempts >= 1),
    next_retry_at   timestamptz,
    last_error      text,
    error_message   text,
    lease_owner     text,
    lease_until     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CONSTRAINT ingest_task_attempts_in_range CHECK (attempt_count >= 0 AND attempt_count <= max_attempts),
    CONSTRAINT ingest_task_running_has_lease CHECK (status <> 'RUNNING' OR (lease_owner IS NOT NULL AND lease_until IS NOT NULL))
);

-- A repeated idempotency key returns the existing task of that kind.
CREATE UNIQUE INDEX ingest_task_idempotency_key_idx ON ingest_task (kind, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Dedup-by-payload lookups.
CREATE INDEX ingest_task_payload_sha_idx ON ingest_task (kind, payload_sha);
-- Listing newest first (keyset) by status, by kind, and overall; the rescuer's
-- scan of QUEUED/RETRYING tasks used the status index too, until migration
-- 00002 gave it ingest_task_rescue_idx.
CREATE INDEX ingest_task_status_created_idx ON ingest_task (status, created_at DESC, id DESC);
CREATE INDEX ingest_task_kind_created_idx ON ingest_task (kind, created_at DESC, id DESC);
CREATE INDEX ingest_task_created_idx ON ingest_task (created_at DESC, id DESC);
-- The rescuer's scan for RUNNING tasks whose lease expired.
CREATE INDEX ingest_task_running_lease_idx ON ingest_task (lease_until) WHERE status = 'RUNNING';

-- ingest_task_transition: one audit row per state change, written in the
-- same transaction as the change.
CREATE TABLE ingest_task_transition (
    id            bigserial   PRIMARY KEY,
    task_id       uuid        NOT NULL REFERENCES ingest_task (id) ON DELETE CASCADE,
    from_status   text        CHECK (from_status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD')),
    to_status     text        NOT NULL CHECK (to_status IN ('QUEUED', 'RUNNING', 'RETRYING', 'SUCCEEDED', 'DEAD')),
    attempt_count int         NOT NULL,
    message       text,
    worker        text,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ingest_task_transition_task_idx ON ingest_task_transition (task_id, id);

-- outbox_event: a task that must be published to a Redis stream. Written in
-- the transaction that creates (or redrives, or rescues) the task.
CREATE TABLE outbox_event (
    id            bigserial   PRIMARY KEY,
    task_id       uuid        NOT NULL REFERENCES ingest_task (id) ON DELETE CASCADE,
    stream        text        NOT NULL CHECK (stream <> ''),
    status        text        NOT NULL DEFAULT 'NEW' CHECK (status IN ('NEW', 'RETRYING', 'SENT', 'DEAD')),
    attempt_count int         NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    next_retry_at timestamptz NOT NULL DEFAULT now(),
    claimed_by    text,
    claimed_until timestamptz,
    last_error    text,
    stream_id     text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    sent_at       timestamptz,
    CONSTRAINT outbox_event_sent_has_id CHECK (status <> 'SENT' OR (stream_id IS NOT NULL AND sent_at IS NOT NULL))
);
-- The relay's claim scan: only unsent rows, oldest due first.
CREATE INDEX outbox_event_claim_idx ON outbox_event (next_retry_at, id) WHERE status IN ('NEW', 'RETRYING');
-- The rescuer's "has an unsent outbox row" check and per-task lookups.
CREATE INDEX outbox_event_task_idx ON outbox_event (task_id);
-- Mapping a (trimmed or deleted) stream entry id back to its task.
CREATE INDEX outbox_event_stream_id_idx ON outbox_event (stream, stream_id) WHERE stream_id IS NOT NULL;
-- Retention of SENT rows, and the operator's "latest 20" query.
CREATE INDEX outbox_event_sent_idx ON outbox_event (sent_at) WHERE status = 'SENT';
CREATE INDEX outbox_event_created_idx ON outbox_event (created_at DESC);

-- Wake relays when outbox rows commit: NOTIFY is delivered at commit and
-- never for a rolled-back transaction. One notification per statement.
-- +goose StatementBegin
CREATE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ingest_outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();

-- +goose Down
DROP TABLE outbox_event;
DROP FUNCTION outbox_event_notify();
DROP TABLE ingest_task_transition;
DROP TABLE ingest_task;
