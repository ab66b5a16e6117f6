-- +goose Up
-- A task created without max_attempts has none of its own (NULL): the
-- worker that records a failed run decides RETRYING or DEAD against its
-- own INGEST_REDIS_MAX_ATTEMPTS (task.Config.MaxAttempts), so lowering the
-- setting on the workers takes effect for such tasks, whoever created them.
-- Rows created before keep the value they were given.
ALTER TABLE ingest_task ALTER COLUMN max_attempts DROP NOT NULL;
COMMENT ON COLUMN ingest_task.max_attempts IS 'runs allowed; NULL: the failing worker''s INGEST_REDIS_MAX_ATTEMPTS';

-- +goose Down
UPDATE ingest_task SET max_attempts = greatest(10, attempt_count) WHERE max_attempts IS NULL;
ALTER TABLE ingest_task ALTER COLUMN max_attempts SET NOT NULL;
COMMENT ON COLUMN ingest_task.max_attempts IS NULL;
