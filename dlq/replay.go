package dlq

import (
	"context"
	"errors"
	"fmt"

	"github.com/ingest-worker/ingest/internal/clip"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/task"
)

// Redriver is what Replay needs of the task store (*task.Store).
type Redriver interface {
	Redrive(ctx context.Context, actor string, ids ...uuid.UUID) ([]task.Result, error)
}

// ReplayOutcome says what Replay did with one DLQ entry.
type ReplayOutcome string

const (
	// Replayed: the task went DEAD → QUEUED (with a new outbox event) and
	// the DLQ entry was removed after that commit.
	Replayed ReplayOutcome = "replayed"
	// NotDead: the task is no longer DEAD (redriven another way, or a stale
	// duplicate entry): nothing to replay; the entry was removed.
	NotDead ReplayOutcome = "not_dead"
	// Poison: the entry has no valid task_id, so it cannot be replayed
	// through the store; it was kept. Re-publish it by hand if it matters.
	Poison ReplayOutcome = "poison"
	// TaskNotFound: no task has the entry's task_id; the entry was kept.
	TaskNotFound ReplayOutcome = "task_not_found"
	// EntryNotFound: the DLQ has no entry with that id.
	EntryNotFound ReplayOutcome = "entry_not_found"
)

// ReplayResult is the outcome of Replay for one DLQ entry.
type ReplayResult struct {
	EntryID string        `json:"entry_id"`
	TaskID  uuid.UUID     `json:"task_id,omitzero"`
	Outcome ReplayOutcome `json:"outcome"`
	// Status is the task's status after the call ("" when unknown).
	Status task.State `json:"status,omitempty"`
	// Detail explains Poison and NotDead outcomes.
	Detail string `json:"detail,omitempty"`
}

// Replay redrives the DEAD tasks of the DLQ entries entryIDs of the stream
// key, in one store call, and then removes the entries whose task was
// redriven or is no longer DEAD. actor is recorded in the audit trail. An
// error after the commit (the XDEL) leaves entries that a repeated Replay
// removes as NotDead.
func Replay(ctx context.Context, rdb redis.UniversalClient, key string, store Redriver, actor string, entryIDs ...string) ([]ReplayResult, error) {
	if key == "" {
		return nil, errors.New("dlq replay: no DLQ stream key")
	}
	out := make([]ReplayResult, len(entryIDs))
	var ids []uuid.UUID
	for i, eid := range entryIDs {
		out[i].EntryID = eid
		if !ValidEntryID(eid) {
			out[i].Outcome, out[i].Detail = EntryNotFound, "not a stream entry id"
			continue
		}
		e, ok, err := Get(ctx, rdb, key, eid)
		if err != nil {
			return nil, err
		}
		if !ok {
			out[i].Outcome = EntryNotFound
			continue
		}
		id, perr := uuid.Parse(e.TaskID)
		if perr != nil || len(e.TaskID) != 36 || id == uuid.Nil {
			out[i].Outcome = Poison
			out[i].Detail = fmt.Sprintf("task_id %q is not a task id: a poison message cannot be replayed through the store (last_error: %s)",
				clip.String(e.TaskID, 64), clip.String(e.LastError, 200))
			continue
		}
		out[i].TaskID = id
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return out, nil
	}
	res, err := store.Redrive(ctx, actor, ids...)
	if err != nil {
		return nil, fmt.Errorf("dlq replay: %w", err)
	}
	byID := make(map[uuid.UUID]task.Result, len(res))
	for _, r := range res {
		byID[r.ID] = r
	}
	var del []string
	for i := range out {
		if out[i].Outcome != "" {
			continue
		}
		r := byID[out[i].TaskID]
		out[i].Status = r.Status
		switch {
		case r.Applied:
			out[i].Outcome = Replayed
			del = append(del, out[i].EntryID)
		case r.Status == "":
			out[i].Outcome = TaskNotFound
		default:
			out[i].Outcome = NotDead
			out[i].Detail = fmt.Sprintf("task is %s, not DEAD", r.Status)
			del = append(del, out[i].EntryID)
		}
	}
	if len(del) > 0 {
		if err := rdb.XDel(ctx, key, del...).Err(); err != nil {
			return out, fmt.Errorf("dlq replay: tasks redriven, but removing %d entries from %s failed: %w", len(del), key, err)
		}
	}
	return out, nil
}
