package dlq

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/task"
)

// Redrive sends the DEAD or CANCELLED tasks ids back to QUEUED through the
// store (task.Store.Redrive: one transaction, audited with actor) and then
// removes every DLQ entry of the tasks it moved from the stream key ("":
// no DLQ). It is the one path by which a task id is redriven (the API's
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
	n, err := RemoveTasks(context.WithoutCancel(ctx), rdb, key, task.Redriven(res))
	if err != nil {
		return res, n, &RemoveError{Redriven: len(task.Redriven(res)), Err: err}
	}
	return res, n, nil
}

// RemoveError is Redrive's error when the tasks were redriven but their
// DLQ entries could not be removed.
type RemoveError struct {
	// Redriven counts the tasks redriven.
	Redriven int
	Err      error
}

func (e *RemoveError) Error() string {
	return fmt.Sprintf("%d tasks redriven, but their DLQ entries were not removed: %v", e.Redriven, e.Err)
}

func (e *RemoveError) Unwrap() error { return e.Err }
