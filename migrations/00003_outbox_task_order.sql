-- +goose Up
-- The rescuer reads a task's latest outbox row (ORDER BY id DESC LIMIT 1
-- over task_id), and re-checks it with max(id). On (task_id) alone, a plan
-- made without statistics walked the primary key backwards and filtered on
-- task_id: O(outbox rows) per candidate, 23 ms each with 200,000 rows.
-- On (task_id, id) the latest row is the first entry of the task's range
-- whatever the statistics say.
DROP INDEX outbox_event_task_idx;
CREATE INDEX outbox_event_task_idx ON outbox_event (task_id, id);

-- +goose Down
DROP INDEX outbox_event_task_idx;
CREATE INDEX outbox_event_task_idx ON outbox_event (task_id);
