-- +goose Up
-- The DEAD outbox rows on an index of their own: outbox_event_dead_idx,
-- partitioned, each partition's <partition>_dead_idx. The count of them
-- that `ingest-worker pending` shows (outbox.ReadStats) had no index to
-- read and scanned every partition of outbox_event whole, seconds on a
-- table of millions of rows, to find the few rows whose publishing gave
-- up. Only DEAD rows are in it: a row enters it when it goes DEAD, and
-- the marking of a published row writes nothing in it (that update was
-- not HOT before either: the claim index's predicate names status).
--
-- Each partition's index is built first, under the name the partitions'
-- other indexes follow (as outbox_event_index names them), and the
-- parent's index takes them as its partitions without building them
-- again, as in 00027. SHARE on the table, taken first, holds the writers
-- of outbox rows for the time of one read of each partition, and keeps
-- the leader from attaching a partition meanwhile (which would get an
-- index of another name).
LOCK TABLE outbox_event IN SHARE MODE;
-- +goose StatementBegin
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT name FROM outbox_event_partitions() LOOP
        EXECUTE format($f$CREATE INDEX %I ON %I (id) WHERE status = 'DEAD'$f$, p.name || '_dead_idx', p.name);
    END LOOP;
END;
$$;
-- +goose StatementEnd
CREATE INDEX outbox_event_dead_idx ON outbox_event (id) WHERE status = 'DEAD';

-- A partition the leader opens gets it too (outbox_event_extend builds a
-- partition's indexes with outbox_event_index before the attach, which
-- takes them as the partitions of the parent's).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_index(part text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (id)', part, part || '_pkey');
    EXECUTE format($f$CREATE INDEX %I ON %I (next_retry_at, id) WHERE status IN ('NEW', 'RETRYING')$f$, part || '_claim_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (task_id, id)', part || '_task_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (stream, stream_id) WHERE stream_id IS NOT NULL', part || '_stream_id_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (created_at DESC)', part || '_created_idx', part);
    EXECUTE format($f$CREATE INDEX %I ON %I (id) WHERE status = 'DEAD'$f$, part || '_dead_idx', part);
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- The body of migration 00027; dropping the parent's index drops each
-- partition's.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_index(part text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (id)', part, part || '_pkey');
    EXECUTE format($f$CREATE INDEX %I ON %I (next_retry_at, id) WHERE status IN ('NEW', 'RETRYING')$f$, part || '_claim_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (task_id, id)', part || '_task_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (stream, stream_id) WHERE stream_id IS NOT NULL', part || '_stream_id_idx', part);
    EXECUTE format('CREATE INDEX %I ON %I (created_at DESC)', part || '_created_idx', part);
END;
$$;
-- +goose StatementEnd
DROP INDEX outbox_event_dead_idx;
