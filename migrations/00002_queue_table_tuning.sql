-- +goose Up
-- Queue tables churn: every task row is updated twice and every outbox row
-- twice within seconds of its insert.
--
-- fillfactor leaves room on each page so that an update which changes no
-- indexed column can be HOT (no new index entries, pruned without VACUUM):
-- the relay's claim of outbox rows (claimed_by, claimed_until). Updates of
-- ingest_task change status, which indexes use, so they are never HOT;
-- the room there keeps a row's new version on its page. It applies to
-- pages written from now on.
ALTER TABLE outbox_event SET (fillfactor = 50);
ALTER TABLE ingest_task SET (fillfactor = 80);

-- Vacuum the queue tables early and without throttling, so dead row
-- versions (and the index entries pointing at them) do not pile up under
-- the claim, start and rescuer scans.
ALTER TABLE ingest_task SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE outbox_event SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
ALTER TABLE ingest_task_transition SET (autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_cost_delay = 0);

-- The rescuer pages QUEUED and RETRYING tasks on (created_at, id). The
-- status index leads with status, and its statistics go stale as a queue
-- drains, so plans fell back to scanning every task on created_at: O(table)
-- per page. This partial index holds only waiting tasks' versions (an
-- update to RUNNING adds nothing to it): O(page) whatever the table holds.
CREATE INDEX ingest_task_rescue_idx ON ingest_task (created_at, id) WHERE status IN ('QUEUED', 'RETRYING');

-- +goose Down
DROP INDEX ingest_task_rescue_idx;
ALTER TABLE outbox_event RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor,
    autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay);
ALTER TABLE ingest_task RESET (fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor,
    autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay);
ALTER TABLE ingest_task_transition RESET (autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_cost_delay);
