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

-- +goose Down
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
