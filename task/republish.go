package task

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/outbox"
)

// republishSQL returns the tasks to republish for deleted entry ids ($2) of
// a stream ($1): the task of each id's outbox event, when the task is not
// terminal and has no later outbox event (a later event already carries it:
// an entry in the stream, or one still to be published).
var republishSQL = `
WITH gone AS (
    SELECT DISTINCT ON (e.task_id) e.task_id, e.id AS event_id
    FROM outbox_event e
    WHERE e.stream = $1 AND e.stream_id = ANY($2::text[])
    ORDER BY e.task_id, e.id DESC
)
SELECT t.id
FROM gone g JOIN ingest_task t ON t.id = g.task_id
WHERE t.status NOT IN ` + terminalSQL + `
  AND NOT EXISTS (SELECT 1 FROM outbox_event l WHERE l.task_id = g.task_id AND l.id > g.event_id)
ORDER BY t.id`

// matchedSQL counts the deleted entry ids ($2) of a stream ($1) that have
// an outbox event.
const matchedSQL = `SELECT count(*) FROM outbox_event WHERE stream = $1 AND stream_id = ANY($2::text[])`

// RepublishDeleted maps entry ids of stream that were trimmed or deleted
// while pending back to their tasks, and gives each task that still has to
// run (not terminal, no later outbox event) a new outbox event to to (the
// task stream, whose relay publishes each task to the stream of its
// priority: stream itself, or another level's), in one transaction. It returns the tasks republished and how many of the
// ids matched an outbox event at all. A republished task that turns out to
// be finished or running elsewhere by the time its new entry is read is
// harmless: starting a task is a guarded transition.
func RepublishDeleted(ctx context.Context, db DB, stream, to string, entryIDs []string) (tasks []uuid.UUID, matched int, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := outbox.LockForWrite(ctx, tx); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, matchedSQL, stream, entryIDs).Scan(&matched); err != nil {
			return fmt.Errorf("look up outbox events: %w", err)
		}
		if matched == 0 {
			tasks = nil
			return nil
		}
		rows, err := tx.Query(ctx, republishSQL, stream, entryIDs)
		if err != nil {
			return fmt.Errorf("find tasks to republish: %w", err)
		}
		if tasks, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
			return fmt.Errorf("find tasks to republish: %w", err)
		}
		return outbox.Insert(ctx, tx, to, tasks...)
	})
	if err != nil {
		return nil, 0, err
	}
	return tasks, matched, nil
}
