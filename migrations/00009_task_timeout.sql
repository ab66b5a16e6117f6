-- +goose Up
-- A task's own handler timeout in milliseconds; NULL: the worker's default
-- for the task's kind applies (docs/ARCHITECTURE.md §3, §5).
ALTER TABLE ingest_task ADD COLUMN timeout_ms int CHECK (timeout_ms > 0);

-- +goose Down
ALTER TABLE ingest_task DROP COLUMN timeout_ms;
