package dlq

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Redrive sends the DEAD or CANCELLED tasks ids back to QUEUED through the
// store (task.Store.Redrive: one transaction, audited with actor) and then
// removes from the stream key ("": no DLQ) the DLQ entries of the deaths it
// undid: the entries of each task it moved, but those of a death after the
// redrive (the task ran and died again before the removal). It is the one
// path by which a task id is redriven (the API's
// POST /v1/tasks/{id}/redrive, the dashboard's task page), as
// RedriveMatching is for a filter and Replay for DLQ entries: a redriven
// task never keeps an entry of its old death, so that the DLQ's depth is
// the number of DEAD tasks with an entry.
//
// The entries are removed after the commit. When their removal fails the
// tasks stay redriven, and the error (a *RemoveError) says so; a later
// Replay of those entries reports them NotDead and removes them.
func Redrive(ctx context.Context, rdb redis.UniversalClient, key string, store Redriver, actor string, ids ...uuid.UUID) ([]task.Result, int, error) {
	res, err := store.Redrive(ctx, actor, ids...)
	if err != nil {
		return nil, 0, err
	}
	n, err := removeRedriven(context.WithoutCancel(ctx), rdb, key, res)
	if err != nil {
		return res, n, &RemoveError{Op: "redriven", Tasks: len(task.Redriven(res)), Err: err}
	}
	return res, n, nil
}

// RemoveError is the error of Redrive and Delete when the tasks were
// redriven or deleted but their entries in Redis (DLQ entries; for
// Delete, also task-stream entries) could not all be removed.
type RemoveError struct {
	// Op is what was done to the tasks: "redriven" or "deleted".
	Op string
	// Tasks counts the tasks redriven or deleted.
	Tasks int
	Err   error
}

func (e *RemoveError) Error() string {
	return fmt.Sprintf("%d tasks %s, but their entries were not all removed from Redis: %v", e.Tasks, e.Op, e.Err)
}

func (e *RemoveError) Unwrap() error { return e.Err }

// Deleter is what Delete needs of the task store (*task.Store).
type Deleter interface {
	DeleteTerminal(ctx context.Context, ids ...uuid.UUID) ([]task.DeleteResult, error)
}

// Delete deletes the finished tasks ids (SUCCEEDED, DEAD or CANCELLED)
// with their audit and outbox rows (task.DeleteTerminal: one statement, a
// live task kept) and then, with a Redis client (nil in Kafka mode, whose
// records are committed already), removes the deleted tasks' entries
// from the task stream (stream.Forget: an entry still pending, e.g. of a
// task cancelled while it was pending, would otherwise be claimed by a
// reclaimer, find no task and be dead-lettered as poison) and their DLQ
// entries from the stream key ("": no DLQ). It is the one path by which
// an operator deletes tasks (the API's DELETE /v1/tasks/{id}, task delete,
// the dashboard), as Redrive is for redriving them. It returns a result
// per id that exists and the number of DLQ entries removed; when the
// removal of entries fails the tasks stay deleted and the error is a
// *RemoveError.
func Delete(ctx context.Context, rdb redis.UniversalClient, key string, store Deleter, ids ...uuid.UUID) ([]task.DeleteResult, int, error) {
	res, err := store.DeleteTerminal(ctx, ids...)
	if err != nil {
		return nil, 0, err
	}
	var deleted []uuid.UUID
	var entries []stream.EntryRef
	for _, r := range res {
		if r.Deleted {
			deleted = append(deleted, r.ID)
			entries = append(entries, r.Entries...)
		}
	}
	if rdb == nil {
		return res, 0, nil
	}
	ctx = context.WithoutCancel(ctx)
	_, ferr := stream.Forget(ctx, rdb, entries)
	if ferr != nil {
		ferr = fmt.Errorf("task stream entries: %w", ferr)
	}
	n, err := RemoveTasks(ctx, rdb, key, deleted)
	if err = errors.Join(ferr, err); err != nil {
		return res, n, &RemoveError{Op: "deleted", Tasks: len(deleted), Err: err}
	}
	return res, n, nil
}
