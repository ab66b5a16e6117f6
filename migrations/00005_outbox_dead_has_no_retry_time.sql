-- +goose Up
-- A DEAD outbox row is never published again, so like a DEAD task it has no
-- retry time: the relay sets next_retry_at to NULL when a row goes DEAD.
-- Rows still to be published (NEW, RETRYING) keep a due time, which the
-- relay's claim needs to find them.
ALTER TABLE outbox_event ALTER COLUMN next_retry_at DROP NOT NULL;
UPDATE outbox_event SET next_retry_at = NULL WHERE status = 'DEAD';
ALTER TABLE outbox_event ADD CONSTRAINT outbox_event_unsent_is_due
    CHECK (status NOT IN ('NEW', 'RETRYING') OR next_retry_at IS NOT NULL);

-- +goose Down
ALTER TABLE outbox_event DROP CONSTRAINT outbox_event_unsent_is_due;
UPDATE outbox_event SET next_retry_at = created_at WHERE next_retry_at IS NULL;
ALTER TABLE outbox_event ALTER COLUMN next_retry_at SET NOT NULL;
