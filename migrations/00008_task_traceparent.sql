-- +goose Up
-- The W3C traceparent of the span a task was created under (an API
-- request's traceparent header, or the span in the creating context):
-- the parent of its publish and attempt spans. NULL: no trace.
ALTER TABLE ingest_task ADD COLUMN traceparent text;
COMMENT ON COLUMN ingest_task.traceparent IS 'W3C traceparent of the creating span; NULL: none';

-- +goose Down
ALTER TABLE ingest_task DROP COLUMN traceparent;
