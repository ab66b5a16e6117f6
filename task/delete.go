package task

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/stream"
)

// DeleteResult is what DeleteTerminal did with one task id.
type DeleteResult struct {
	ID uuid.UUID
	// Status is the task's state: the state it was deleted in, or the
	// state that kept it (a live task is never deleted).
	Status State
	// Deleted: the task, its audit rows and its outbox rows are gone.
	Deleted bool
	// Entries are the stream entries the deleted task's outbox rows had
	// published (outbox_event.stream and stream_id), oldest first; none
	// for a kept task. They may still be in their stream, undelivered or
	// pending (a task cancelled while its entry was pending, a lost
	// XACK): the caller removes them after the statement (stream.Forget),
	// or a worker would read an entry of no task. In Kafka mode they are
	// records, committed already, and there is nothing to remove.
	Entries []stream.EntryRef
}

// deleteTerminalSQL deletes those tasks of $1 that are terminal
// (SUCCEEDED, DEAD or CANCELLED) with their audit and outbox rows, in one
// statement (finishedCTEs). It returns a row per deleted task, with
// the stream entries it had, and one per task of $1 that exists but was
// kept (live), with its state; an unknown id has none.
var deleteTerminalSQL = `
WITH pick AS (SELECT unnest($1::uuid[]) AS id),` + finishedCTEs(true) + `
SELECT id, status, true, streams, stream_ids FROM d
UNION ALL
SELECT id, status, false, '{}'::text[], '{}'::text[] FROM ingest_task WHERE id = ANY($1::uuid[]) AND id NOT IN (SELECT id FROM t)`

// DeleteTerminal deletes the tasks of ids that are terminal (SUCCEEDED,
// DEAD or CANCELLED), each with its audit rows and outbox rows, in one
// statement, and returns a result per id that exists (an unknown id has
// none): Deleted, or kept with its live state. It is the one deletion of
// tasks by id, for an operator's delete and for batch deletions alike.
// The tasks' stream entries and DLQ entries are in Redis: the caller
// removes those of the deleted tasks after the statement (dlq.Delete:
// stream.Forget and dlq.RemoveTasks).
func DeleteTerminal(ctx context.Context, db DB, ids []uuid.UUID) ([]DeleteResult, error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, deleteTerminalSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("delete %d tasks: %w", len(ids), err)
	}
	res, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeleteResult, error) {
		var r DeleteResult
		var streams, ids []string
		err := row.Scan(&r.ID, &r.Status, &r.Deleted, &streams, &ids)
		r.Entries = entryRefs(streams, ids)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("delete %d tasks: %w", len(ids), err)
	}
	return res, nil
}

// DeleteTerminal is DeleteTerminal on the store's pool.
func (s *Store) DeleteTerminal(ctx context.Context, ids ...uuid.UUID) ([]DeleteResult, error) {
	return DeleteTerminal(ctx, s.db, ids)
}

// Delete deletes task id if it is terminal (DeleteTerminal). It returns
// ErrNotFound for an unknown id, and a result with Deleted false and the
// live state for a task that is not terminal.
func (s *Store) Delete(ctx context.Context, id uuid.UUID) (DeleteResult, error) {
	res, err := DeleteTerminal(ctx, s.db, []uuid.UUID{id})
	if err != nil {
		return DeleteResult{}, err
	}
	if len(res) == 0 {
		return DeleteResult{}, fmt.Errorf("delete task %s: %w", id, ErrNotFound)
	}
	return res[0], nil
}

// Refusal explains why a task was kept ("" when it was deleted): the one
// wording of the API, the CLI and the dashboard.
func (r DeleteResult) Refusal() string {
	if r.Deleted {
		return ""
	}
	return fmt.Sprintf("task %s is %s; only SUCCEEDED, DEAD and CANCELLED tasks can be deleted", r.ID, r.Status)
}
