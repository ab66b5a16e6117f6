-- +goose Up
-- Strict order per key (package task, sequence.go). The tasks of one kind
-- that share a sequence_key run one at a time, in creation order: a new
-- task with a key gets one 'sequence' edge (ingest_task_dependency,
-- migration 00018) to the previous task of its (kind, sequence_key) that
-- has not yet released its successors, and waits (waiting_for > 0) until
-- that edge is released.
--
-- sequence_key: the key; NULL: the task is in no sequence.
-- sequence_no: the task's place in its sequence, from 1 (the previous
-- task's plus one, given under a transaction-scoped advisory lock on the
-- kind and key, so that creators in any process number a key's tasks in
-- the order they commit). NULL when sequence_key is.
--
-- Nullable without a default: only the catalog changes. Neither column is
-- ever updated, so the index below keeps a task's state changes HOT; it
-- holds only tasks with a key, and finds a key's latest task in one probe.
ALTER TABLE ingest_task
    ADD COLUMN sequence_key text,
    ADD COLUMN sequence_no bigint;
ALTER TABLE ingest_task ADD CONSTRAINT ingest_task_sequence_key_short
    CHECK (octet_length(sequence_key) <= 1000) NOT VALID;
CREATE INDEX ingest_task_sequence_idx ON ingest_task (kind, sequence_key, sequence_no)
    WHERE sequence_key IS NOT NULL;
COMMENT ON COLUMN ingest_task.sequence_key IS 'tasks of one kind with the same key run one at a time, in creation order; NULL: none';
COMMENT ON COLUMN ingest_task.sequence_no IS 'place of the task in its (kind, sequence_key), from 1';

-- What a DEAD task of the kind does to its sequence: 'block' (its
-- successors wait until it is redriven and succeeds, cancelled or
-- deleted) or 'continue' (they go on).
ALTER TABLE ingest_kind
    ADD COLUMN sequence_on_failure text NOT NULL DEFAULT 'block'
        CHECK (sequence_on_failure IN ('block', 'continue'));
-- The setting after a change (NULL: not changed by it).
ALTER TABLE ingest_kind_change
    ADD COLUMN sequence_on_failure text;

-- The DEAD case of a 'sequence' edge (migration 00018's one place for
-- it): a DEAD task releases its successor when its kind's
-- sequence_on_failure is 'continue'.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_sequence_continues(kind text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT k.sequence_on_failure = 'continue' FROM ingest_kind k WHERE k.kind = $1), false)
$$;
-- +goose StatementEnd

-- A task cancelled while its sequence predecessor still holds it passes
-- that hold on: each successor it holds gets a 'sequence' edge to its
-- predecessor (and one more in waiting_for) before the cancel releases
-- the successor's edge to it (ingest_task_release_dependents, which fires
-- after this trigger: triggers of one event fire by name). So cancelling
-- a task in the middle of a sequence never lets the next one run beside
-- the one before it. When consecutive tasks are cancelled in one
-- statement (the cascade of a dead dependency), the hold passes from the
-- first one not cancelled before them to the first one not cancelled
-- after them.
-- +goose StatementBegin
CREATE FUNCTION ingest_task_pass_on_sequence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH RECURSIVE c AS (
        SELECT DISTINCT task_id AS id FROM new_rows WHERE to_status = 'CANCELLED'
    ), up AS (
        SELECT c.id, p.depends_on AS pred
        FROM c JOIN ingest_task_dependency p ON p.task_id = c.id AND p.reason = 'sequence' AND p.released_at IS NULL
    ), root AS (
        SELECT id, pred, 0 AS depth FROM up
        UNION ALL
        SELECT r.id, u.pred, r.depth + 1 FROM root r JOIN up u ON u.id = r.pred WHERE r.depth < 100000
    ), x AS (
        SELECT id, pred FROM root WHERE pred NOT IN (SELECT id FROM c)
    ), moved AS (
        INSERT INTO ingest_task_dependency (task_id, depends_on, reason)
        SELECT s.task_id, x.pred, 'sequence'
        FROM x JOIN ingest_task_dependency s ON s.depends_on = x.id AND s.reason = 'sequence' AND s.released_at IS NULL
        WHERE s.task_id NOT IN (SELECT id FROM c)
        ORDER BY s.task_id
        ON CONFLICT DO NOTHING
        RETURNING task_id
    )
    UPDATE ingest_task t SET waiting_for = coalesce(t.waiting_for, 0) + 1
    FROM moved m WHERE t.id = m.task_id;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ingest_task_pass_on_sequence AFTER INSERT ON ingest_task_transition
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ingest_task_pass_on_sequence();

-- Sequences from SQL (docs/SQL-ENQUEUE.md): ingest_enqueue and
-- ingest_enqueue_batch take sequence_key, as POST /v1/tasks does. The entry
-- points take it off each task (ingest_enqueue_strip), create the tasks
-- and link their dependencies as before, then ingest_enqueue_sequence
-- places each task this call created in its sequence as the Go store does
-- (task/sequence.go): the same advisory lock per kind and key, the next
-- sequence_no, one 'sequence' edge to the previous task that has not let
-- its successors go (share-locked), one more in waiting_for and its outbox
-- row held back.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_strip(tasks jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(tasks) = 'array' THEN coalesce(
        (SELECT jsonb_agg(CASE WHEN jsonb_typeof(e) = 'object' THEN e - ARRAY['depends_on', 'on_dependency_failure', 'ref', 'sequence_key'] ELSE e END ORDER BY o)
         FROM jsonb_array_elements(tasks) WITH ORDINALITY AS x(e, o)), '[]'::jsonb)
    ELSE tasks END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION ingest_enqueue_sequence(ids uuid[], tasks jsonb, numbered boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    max_key constant int := 1000;
    unsafe_re constant text := '[\x01-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]';
    held_until constant timestamptz := '9999-12-31 00:00:00+00';
    el jsonb;
    v jsonb;
    t text;
    key text;
    kd text;
    pre text;
    c text;
    h record;
    tid uuid;
    linked boolean;
BEGIN
    IF jsonb_typeof(tasks) <> 'array' THEN
        RETURN;
    END IF;
    FOR pos IN 0 .. jsonb_array_length(tasks) - 1 LOOP
        el := tasks->pos;
        CONTINUE WHEN jsonb_typeof(el) <> 'object';
        pre := CASE WHEN numbered THEN format('task %s: ', pos) ELSE '' END;
        v := el->'sequence_key';
        t := jsonb_typeof(v);
        CONTINUE WHEN coalesce(t, 'null') = 'null';
        IF t <> 'string' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'sequence_key',
                MESSAGE = pre || format('sequence_key must be a JSON string, got %s', CASE t WHEN 'boolean' THEN 'bool' ELSE t END);
        END IF;
        key := v->>0;
        IF octet_length(key) > max_key THEN
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'sequence_key',
                MESSAGE = pre || format('sequence_key is longer than %s bytes', max_key);
        ELSIF key ~ unsafe_re THEN
            c := substring(key FROM unsafe_re);
            RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'sequence_key',
                MESSAGE = pre || format('sequence_key must not hold control or bidirectional characters, got %s at byte %s',
                    ingest_enqueue_escape(c), octet_length(substring(key FROM '^[^' || substr(unsafe_re, 2) || '*')));
        END IF;
    END LOOP;

    -- The locks of the sequences of the tasks this call created (not those
    -- an idempotency key or the payload dedup found), in the Go store's
    -- order and names.
    PERFORM pg_advisory_xact_lock(hashtextextended(n, 0)) FROM (
        SELECT DISTINCT format('seq/%s/%s/%s', octet_length(k.kind), k.kind, x.e->>'sequence_key') COLLATE "C" AS n
        FROM jsonb_array_elements(tasks) WITH ORDINALITY AS x(e, o)
        JOIN ingest_task k ON k.id = ids[x.o]
        WHERE jsonb_typeof(x.e) = 'object' AND coalesce(x.e->>'sequence_key', '') <> ''
          AND k.created_at = now() AND k.sequence_no IS NULL) l
    ORDER BY n;

    FOR pos IN 0 .. jsonb_array_length(tasks) - 1 LOOP
        el := tasks->pos;
        CONTINUE WHEN jsonb_typeof(el) <> 'object' OR coalesce(el->>'sequence_key', '') = '';
        key := el->>'sequence_key';
        tid := ids[pos + 1];
        SELECT k.kind INTO kd FROM ingest_task k WHERE k.id = tid AND k.created_at = now() AND k.sequence_no IS NULL;
        CONTINUE WHEN NOT FOUND;
        -- The head of the sequence, as the Go store's seqHeadSQL reads it.
        SELECT coalesce((SELECT t2.sequence_no FROM ingest_task t2 WHERE t2.kind = kd AND t2.sequence_key = key
                         ORDER BY t2.sequence_no DESC LIMIT 1), 0) AS last,
               (SELECT c2.id FROM ingest_task c2 WHERE c2.kind = kd AND c2.sequence_key = key AND c2.status <> 'CANCELLED'
                ORDER BY c2.sequence_no DESC LIMIT 1) AS cand
        INTO h;
        UPDATE ingest_task SET sequence_key = key, sequence_no = h.last + 1 WHERE id = tid;
        CONTINUE WHEN h.cand IS NULL;
        SELECT k.status INTO t FROM ingest_task k WHERE k.id = h.cand FOR SHARE;
        CONTINUE WHEN NOT FOUND OR t IN ('SUCCEEDED', 'CANCELLED') OR (t = 'DEAD' AND ingest_sequence_continues(kd));
        WITH e AS (
            INSERT INTO ingest_task_dependency (task_id, depends_on, reason) VALUES (tid, h.cand, 'sequence')
            ON CONFLICT DO NOTHING RETURNING task_id
        )
        SELECT count(*) > 0 INTO linked FROM e;
        CONTINUE WHEN NOT linked;
        UPDATE ingest_task SET waiting_for = coalesce(waiting_for, 0) + 1 WHERE id = tid;
        UPDATE outbox_event SET next_retry_at = held_until WHERE task_id = tid AND status IN ('NEW', 'RETRYING');
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- The entry points' step after the create (migration 00018) gains the
-- sequence's.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_after(ids uuid[], tasks jsonb, numbered boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM ingest_enqueue_link(ids, tasks, numbered);
    PERFORM ingest_enqueue_sequence(ids, tasks, numbered);
END;
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION ingest_enqueue_sequence(uuid[], jsonb, boolean) FROM PUBLIC;

-- +goose Down
-- The step after the create and the strip of migration 00018 again.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_after(ids uuid[], tasks jsonb, numbered boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM ingest_enqueue_link(ids, tasks, numbered);
END;
$$;
-- +goose StatementEnd
DROP FUNCTION ingest_enqueue_sequence(uuid[], jsonb, boolean);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_enqueue_strip(tasks jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(tasks) = 'array' THEN coalesce(
        (SELECT jsonb_agg(CASE WHEN jsonb_typeof(e) = 'object' THEN e - ARRAY['depends_on', 'on_dependency_failure', 'ref'] ELSE e END ORDER BY o)
         FROM jsonb_array_elements(tasks) WITH ORDINALITY AS x(e, o)), '[]'::jsonb)
    ELSE tasks END
$$;
-- +goose StatementEnd
DROP TRIGGER ingest_task_pass_on_sequence ON ingest_task_transition;
DROP FUNCTION ingest_task_pass_on_sequence();
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ingest_sequence_continues(kind text) RETURNS boolean
LANGUAGE sql STABLE AS $$ SELECT false $$;
-- +goose StatementEnd
ALTER TABLE ingest_kind_change DROP COLUMN sequence_on_failure;
ALTER TABLE ingest_kind DROP COLUMN sequence_on_failure;
DROP INDEX ingest_task_sequence_idx;
ALTER TABLE ingest_task
    DROP CONSTRAINT ingest_task_sequence_key_short,
    DROP COLUMN sequence_no,
    DROP COLUMN sequence_key;
