-- +goose Up
-- The NOTIFY of new outbox rows announces only rows that a relay has to
-- find: unsent (NEW or RETRYING) and claimed by no relay. Until now every
-- inserting statement notified, and most inserts on the hot path are of
-- rows no relay needs to look for: a task published directly after its
-- commit gets its row inserted SENT once the entry is in the stream, and
-- a row claimed in its creating transaction by the process's own relay
-- (claimed_until set) is published by that relay. Each such notification
-- woke every relay of every process for a claim that found nothing (a
-- claim, a rollback and the read of the next due time), and queued the
-- inserting transaction's commit on the server's notification lock
-- behind every other notifying commit.
--
-- The trigger reads the statement's rows from its transition table. It
-- is dropped and created again with that table, keeping its enabled
-- state; inserts into a partition by name fire no trigger of the parent,
-- as before.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows r WHERE r.status IN ('NEW', 'RETRYING') AND r.claimed_until IS NULL) THEN
        PERFORM pg_notify('ingest_outbox', '');
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
DECLARE
    enabled "char";
BEGIN
    SELECT t.tgenabled INTO enabled FROM pg_trigger t
    WHERE t.tgrelid = 'outbox_event'::regclass AND t.tgname = 'outbox_event_notify';
    DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event;
    CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
        REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
    IF enabled IS NOT NULL AND enabled <> 'O' THEN
        EXECUTE format('ALTER TABLE outbox_event %s TRIGGER outbox_event_notify',
            CASE enabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END);
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- Every inserting statement notifies again, as migration 00001 had it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION outbox_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ingest_outbox', '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
-- +goose StatementBegin
DO $$
DECLARE
    enabled "char";
BEGIN
    SELECT t.tgenabled INTO enabled FROM pg_trigger t
    WHERE t.tgrelid = 'outbox_event'::regclass AND t.tgname = 'outbox_event_notify';
    DROP TRIGGER IF EXISTS outbox_event_notify ON outbox_event;
    CREATE TRIGGER outbox_event_notify AFTER INSERT ON outbox_event
        FOR EACH STATEMENT EXECUTE FUNCTION outbox_event_notify();
    IF enabled IS NOT NULL AND enabled <> 'O' THEN
        EXECUTE format('ALTER TABLE outbox_event %s TRIGGER outbox_event_notify',
            CASE enabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END);
    END IF;
END;
$$;
-- +goose StatementEnd
