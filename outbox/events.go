package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Event is one outbox_event row of a task as an operator sees it (task
// show, the dashboard's task page).
type Event struct {
	ID           int64      `json:"id"`
	Stream       string     `json:"stream"`
	Status       string     `json:"status"`
	AttemptCount int        `json:"attempt_count"`
	StreamID     string     `json:"stream_id,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
	CreatedAt    time.Time  `json:"created_at"`
	SentAt       *time.Time `json:"sent_at,omitempty"`
}

// taskEventsSQL reads a task's rows through outbox_event_task_idx.
const taskEventsSQL = `
SELECT id, stream, status, attempt_count, coalesce(stream_id, ''), coalesce(last_error, ''), created_at, sent_at
FROM outbox_event WHERE task_id = $1 ORDER BY id`

// TaskEvents returns the outbox rows of task id, oldest first (retention
// removes published rows after a while).
func TaskEvents(ctx context.Context, db Querier, id uuid.UUID) ([]Event, error) {
	rows, err := db.Query(ctx, taskEventsSQL, id)
	if err != nil {
		return nil, fmt.Errorf("read outbox events of %s: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.Stream, &e.Status, &e.AttemptCount, &e.StreamID, &e.LastError, &e.CreatedAt, &e.SentAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox events of %s: %w", id, err)
	}
	return out, nil
}
