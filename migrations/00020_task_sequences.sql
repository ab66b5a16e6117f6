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

-- +goose Down
ALTER TABLE ingest_kind_change DROP COLUMN sequence_on_failure;
ALTER TABLE ingest_kind DROP COLUMN sequence_on_failure;
DROP INDEX ingest_task_sequence_idx;
ALTER TABLE ingest_task
    DROP CONSTRAINT ingest_task_sequence_key_short,
    DROP COLUMN sequence_no,
    DROP COLUMN sequence_key;
