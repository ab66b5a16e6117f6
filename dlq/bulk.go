package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/task"
)

// removeScanCount is how many DLQ entries one XRANGE of RemoveTasks reads.
const removeScanCount = 1000

// RemoveTasks removes from the DLQ stream key every entry of the tasks ids
// (they were deleted, or an operator discards their deaths) and returns
// how many it removed. It reads the whole stream once, a page at a time.
// An empty key (no DLQ) removes nothing.
func RemoveTasks(ctx context.Context, rdb redis.UniversalClient, key string, ids []uuid.UUID) (int, error) {
	upTo := make(map[string]time.Time, len(ids))
	for _, id := range ids {
		upTo[id.String()] = time.Time{}
	}
	return removeEntries(ctx, rdb, key, upTo)
}

// removeRedriven removes from the DLQ stream key the entries of the deaths
// that the redrives res undid: of each task a redrive moved (task.Redriven),
// the entries dead at or before the task had ended (Result.Ended). A task
// that ran and died again between the redrive's commit and this removal
// keeps the entry of its new death.
func removeRedriven(ctx context.Context, rdb redis.UniversalClient, key string, res []task.Result) (int, error) {
	moved := task.Redriven(res)
	upTo := make(map[string]time.Time, len(moved))
	for _, id := range moved {
		upTo[id.String()] = time.Time{}
	}
	for _, r := range res {
		if _, ok := upTo[r.ID.String()]; ok && r.Ended != nil {
			upTo[r.ID.String()] = *r.Ended
		}
	}
	return removeEntries(ctx, rdb, key, upTo)
}

// removeEntries removes from the DLQ stream key the entries of the tasks
// of upTo: all of a task's when its time is zero, else those dead at or
// before it (an entry whose dead_at does not parse goes too). It reads the
// whole stream once, a page at a time, and returns how many it removed.
func removeEntries(ctx context.Context, rdb redis.UniversalClient, key string, upTo map[string]time.Time) (int, error) {
	if key == "" || len(upTo) == 0 {
		return 0, nil
	}
	removed := 0
	start := "-"
	for {
		msgs, err := rdb.XRangeN(ctx, key, start, "+", removeScanCount).Result()
		if err != nil {
			return removed, fmt.Errorf("dlq %s: read entries to remove: %w", key, err)
		}
		var del []string
		for _, m := range msgs {
			tid, _ := m.Values[FieldTaskID].(string)
			bound, hit := upTo[tid]
			if !hit {
				continue
			}
			if !bound.IsZero() {
				text, _ := m.Values[FieldDeadAt].(string)
				if at, err := time.Parse(time.RFC3339, text); err == nil && at.After(bound) {
					continue // a later death
				}
			}
			del = append(del, m.ID)
		}
		if len(del) > 0 {
			n, err := rdb.XDel(ctx, key, del...).Result()
			removed += int(n)
			if err != nil {
				return removed, fmt.Errorf("dlq %s: remove %d entries: %w", key, len(del), err)
			}
		}
		if len(msgs) < removeScanCount {
			return removed, nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

// BulkRedriveResult is the outcome of RedriveMatching: the store's, and
// the DLQ entries removed.
type BulkRedriveResult struct {
	task.BulkRedriveResult
	// DLQRemoved counts the DLQ entries of redriven tasks removed.
	DLQRemoved int `json:"dlq_removed"`
}

// RedriveMatching redrives the tasks that f selects (task.Store.
// RedriveMatching, paced and audited with actor) and then, as Redrive does,
// removes the DLQ entries of the deaths it undid from the stream key ("":
// no DLQ). A dry run changes nothing. The entries are removed only
// after the redrives committed; when their removal fails the tasks stay
// redriven and the error says so (a later Replay of those entries reports
// them NotDead and removes them).
func RedriveMatching(ctx context.Context, rdb redis.UniversalClient, key string, store *task.Store, actor string,
	f task.RedriveFilter, o task.RedriveOptions) (BulkRedriveResult, error) {
	var redriven []task.Result
	if !o.DryRun && key != "" {
		next := o.Redriven
		o.Redriven = func(ctx context.Context, res []task.Result) error {
			redriven = append(redriven, res...)
			if next != nil {
				return next(ctx, res)
			}
			return nil
		}
	}
	res, err := store.RedriveMatching(ctx, actor, f, o)
	out := BulkRedriveResult{BulkRedriveResult: res}
	// Entries of the batches that committed are removed even after an
	// error: their tasks are QUEUED again.
	n, rerr := removeRedriven(context.WithoutCancel(ctx), rdb, key, redriven)
	out.DLQRemoved = n
	if err != nil {
		return out, err
	}
	if rerr != nil {
		return out, fmt.Errorf("bulk redrive: %d tasks redriven, but %w", out.Redriven, rerr)
	}
	return out, nil
}
