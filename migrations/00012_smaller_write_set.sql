-- +goose Up
-- A smaller write set per task (docs/ARCHITECTURE.md §3.5). Before this
-- migration a task cost about 51 WAL records: every transition wrote a new
-- version of the task row with an entry in each of its seven indexes, and
-- each audit and outbox row paid a foreign-key check (a row lock on the
-- task, in the WAL) and one index more than it needed.
--
-- 1. No index of ingest_task names a column that the start of a task
--    changes (status, attempt_count, lease_owner, lease_until, updated_at),
--    so that update can be HOT: a new row version on the same page and no
--    index entry at all. fillfactor 50 leaves that room on each page.
--    Listing newest first is by id (a UUIDv7: creation time, then random),
--    on the primary key, and by kind on (kind, id). The rescuer and the
--    listings of waiting and running tasks read the tasks that are not
--    finished (ingest_task_live_idx): a task leaves it when it finishes, in
--    the one update of its life that is not HOT. The listings of DEAD and
--    CANCELLED tasks read the tasks that failed or were cancelled
--    (ingest_task_failed_idx), which a success never enters.
DROP INDEX ingest_task_status_created_idx;
DROP INDEX ingest_task_created_idx;
DROP INDEX ingest_task_kind_created_idx;
DROP INDEX ingest_task_running_lease_idx;
DROP INDEX ingest_task_rescue_idx;
CREATE INDEX ingest_task_kind_idx ON ingest_task (kind, id);
CREATE INDEX ingest_task_live_idx ON ingest_task (id) WHERE finished_at IS NULL;
CREATE INDEX ingest_task_failed_idx ON ingest_task (id)
    WHERE last_error IS NOT NULL OR cancel_requested_at IS NOT NULL;
-- Every DEAD task has a last error and every CANCELLED one a cancel
-- request, so that ingest_task_failed_idx holds them all. NOT VALID: rows
-- written before are not checked (the transitions have always set them).
ALTER TABLE ingest_task ADD CONSTRAINT ingest_task_failed_is_indexed
    CHECK (CASE status WHEN 'DEAD' THEN last_error IS NOT NULL
                       WHEN 'CANCELLED' THEN cancel_requested_at IS NOT NULL ELSE true END) NOT VALID;
ALTER TABLE ingest_task SET (fillfactor = 50);
-- Payload dedup matches tasks created with it (dedup), the only ones its
-- index holds. The unfinished tasks of before are marked so that they
-- are still matched; finished ones of before are not.
ALTER TABLE ingest_task ADD COLUMN dedup boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN ingest_task.dedup IS 'created with payload dedup: found by a later dedup create with the same payload';
UPDATE ingest_task SET dedup = true WHERE finished_at IS NULL;
DROP INDEX ingest_task_payload_sha_idx;
CREATE INDEX ingest_task_dedup_idx ON ingest_task (kind, payload_sha) WHERE dedup;

-- 2. The audit table has one B-tree, (task_id, id), its primary key: a
--    task's trail in order, as the documented query reads it. Its rows are
--    only ever appended, so the recent rows (the dashboard's charts, a
--    kind's start rate) are found by a BRIN index on created_at, which
--    costs a WAL record only when a transaction's rows widen the summary
--    of the last pages. No foreign key: the rows are written
--    by the transitions of package task, in the transaction that changes
--    the task, and deleted with it.
ALTER TABLE ingest_task_transition DROP CONSTRAINT ingest_task_transition_task_id_fkey;
ALTER TABLE ingest_task_transition DROP CONSTRAINT ingest_task_transition_pkey;
DROP INDEX ingest_task_transition_task_idx;
ALTER TABLE ingest_task_transition ADD CONSTRAINT ingest_task_transition_pkey PRIMARY KEY (task_id, id);
CREATE INDEX ingest_task_transition_created_brin ON ingest_task_transition USING brin (created_at);

-- 3. Outbox rows: no foreign key either (written by package task with the
--    task, deleted with it), and retention finds old SENT rows on
--    outbox_event_created_idx (a row is sent after it is created), so the
--    index on sent_at goes.
ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_task_id_fkey;
DROP INDEX outbox_event_sent_idx;

-- +goose Down
CREATE INDEX outbox_event_sent_idx ON outbox_event (sent_at) WHERE status = 'SENT';
DELETE FROM outbox_event o WHERE NOT EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = o.task_id);
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_task_id_fkey
    FOREIGN KEY (task_id) REFERENCES ingest_task (id) ON DELETE CASCADE;
DROP INDEX ingest_task_transition_created_brin;
ALTER TABLE ingest_task_transition DROP CONSTRAINT ingest_task_transition_pkey;
ALTER TABLE ingest_task_transition ADD CONSTRAINT ingest_task_transition_pkey PRIMARY KEY (id);
CREATE INDEX ingest_task_transition_task_idx ON ingest_task_transition (task_id, id);
DELETE FROM ingest_task_transition r WHERE NOT EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = r.task_id);
ALTER TABLE ingest_task_transition ADD CONSTRAINT ingest_task_transition_task_id_fkey
    FOREIGN KEY (task_id) REFERENCES ingest_task (id) ON DELETE CASCADE;
ALTER TABLE ingest_task SET (fillfactor = 80);
DROP INDEX ingest_task_dedup_idx;
CREATE INDEX ingest_task_payload_sha_idx ON ingest_task (kind, payload_sha);
ALTER TABLE ingest_task DROP COLUMN dedup;
ALTER TABLE ingest_task DROP CONSTRAINT ingest_task_failed_is_indexed;
DROP INDEX ingest_task_failed_idx;
DROP INDEX ingest_task_live_idx;
DROP INDEX ingest_task_kind_idx;
CREATE INDEX ingest_task_rescue_idx ON ingest_task (created_at, id) WHERE status IN ('QUEUED', 'RETRYING');
CREATE INDEX ingest_task_running_lease_idx ON ingest_task (lease_until) WHERE status = 'RUNNING';
CREATE INDEX ingest_task_kind_created_idx ON ingest_task (kind, created_at DESC, id DESC);
CREATE INDEX ingest_task_created_idx ON ingest_task (created_at DESC, id DESC);
CREATE INDEX ingest_task_status_created_idx ON ingest_task (status, created_at DESC, id DESC);
