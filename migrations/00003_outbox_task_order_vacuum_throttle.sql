-- +goose Up
-- The rescuer reads a task's latest outbox row (ORDER BY id DESC LIMIT 1
-- over task_id), and re-checks it with max(id). On (task_id) alone, a plan
-- made without statistics walked the primary key backwards and filtered on
-- task_id: O(outbox rows) per candidate, 23 ms each with 200,000 rows.
-- On (task_id, id) the latest row is the first entry of the task's range
-- whatever the statistics say.
DROP INDEX outbox_event_task_idx;
CREATE INDEX outbox_event_task_idx ON outbox_event (task_id, id);

-- Migration 00002 let autovacuum run unthrottled on the queue tables. On a
-- 2-core machine under a steady 2,000 tasks/s that vacuum took a core from
-- the workers: commit→handler start p50 6.5 ms and the worker fell behind
-- (1,880 tasks/s), against 2.7 ms and 2,000 tasks/s with the server's
-- default cost delay; throughput at full load was the same either way.
-- The early thresholds stay: vacuum and ANALYZE still come often.
ALTER TABLE ingest_task RESET (autovacuum_vacuum_cost_delay);
ALTER TABLE outbox_event RESET (autovacuum_vacuum_cost_delay);
ALTER TABLE ingest_task_transition RESET (autovacuum_vacuum_cost_delay);

-- +goose Down
ALTER TABLE ingest_task SET (autovacuum_vacuum_cost_delay = 0);
ALTER TABLE outbox_event SET (autovacuum_vacuum_cost_delay = 0);
ALTER TABLE ingest_task_transition SET (autovacuum_vacuum_cost_delay = 0);
DROP INDEX outbox_event_task_idx;
CREATE INDEX outbox_event_task_idx ON outbox_event (task_id);
