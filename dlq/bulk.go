package dlq

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/task"
)

// removeScanCount is how many DLQ entries one XRANGE of RemoveTasks reads.
const removeScanCount = 1000

// RemoveTasks removes from the DLQ stream key every entry of the tasks ids
// (they were redriven, so their deaths are dealt with) and returns how many
// it removed. It reads the whole stream once, a page at a time. An empty
// key (no DLQ) removes nothing.
func RemoveTasks(ctx context.Context, rdb redis.UniversalClient, key string, ids []uuid.UUID) (int, error) {
	if key == "" || len(ids) == 0 {
		return 0, nil
	}
	want := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		want[id.String()] = struct{}{}
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
			if tid, ok := m.Values[FieldTaskID].(string); ok {
				if _, hit := want[tid]; hit {
					del = append(del, m.ID)
				}
			}
		}
		if len(del) > 0 {
			n, err := rdb.XDel(ctx, key, del...).Result()
			removed += int(n)
			if err != nil {
				return removed, fmt.Errorf("dlq %s: remove %d entries of redriven tasks: %w", key, len(del), err)
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
// RedriveMatching, paced and audited with actor) and then, as Replay does,
// removes the DLQ entries of the tasks it redrove from the stream key
// ("": no DLQ). A dry run changes nothing. The entries are removed only
// after the redrives committed; when their removal fails the tasks stay
// redriven and the error says so (a later Replay of those entries reports
// them NotDead and removes them).
func RedriveMatching(ctx context.Context, rdb redis.UniversalClient, key string, store *task.Store, actor string,
	f task.RedriveFilter, o task.RedriveOptions) (BulkRedriveResult, error) {
	var redriven []uuid.UUID
	if !o.DryRun && key != "" {
		next := o.Redriven
		o.Redriven = func(ctx context.Context, ids []uuid.UUID) error {
			redriven = append(redriven, ids...)
			if next != nil {
				return next(ctx, ids)
			}
			return nil
		}
	}
	res, err := store.RedriveMatching(ctx, actor, f, o)
	out := BulkRedriveResult{BulkRedriveResult: res}
	// Entries of the batches that committed are removed even after an
	// error: their tasks are QUEUED again.
	n, rerr := RemoveTasks(context.WithoutCancel(ctx), rdb, key, redriven)
	out.DLQRemoved = n
	if err != nil {
		return out, err
	}
	if rerr != nil {
		return out, fmt.Errorf("bulk redrive: %d tasks redriven, but %w", out.Redriven, rerr)
	}
	return out, nil
}
