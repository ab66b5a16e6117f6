package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// createPriority creates n tasks of kind with priority p, in batches of
// 1,000, and returns their ids in creation order.
func (b *serviceBundle) createPriority(kind string, p, n int) []uuid.UUID {
	b.t.Helper()
	var ids []uuid.UUID
	for len(ids) < n {
		nts := make([]task.NewTask, min(1000, n-len(ids)))
		for i := range nts {
			nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, len(ids)+i)), Priority: p}
		}
		res, err := b.store.CreateBatch(context.Background(), nts)
		if err != nil {
			b.t.Fatal(err)
		}
		for _, r := range res {
			ids = append(ids, r.Task.ID)
		}
	}
	return ids
}

// xlen is the length of a stream, 0 when it does not exist.
func (b *serviceBundle) xlen(key string) int64 {
	b.t.Helper()
	n, err := b.rdb.XLen(context.Background(), key).Result()
	if err != nil && err != redis.Nil {
		b.t.Fatal(err)
	}
	return n
}

// startOrder returns the tasks of ids in the order their first start was
// recorded in the audit trail (NULL/QUEUED/RETRYING -> RUNNING), and the
// ones not started yet are left out.
func (b *serviceBundle) startOrder() []uuid.UUID {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT task_id FROM (
		    SELECT DISTINCT ON (task_id) task_id, id FROM ingest_task_transition
		    WHERE to_status = 'RUNNING' ORDER BY task_id, id) first
		ORDER BY id`)
	if err != nil {
		b.t.Fatal(err)
	}
	defer rows.Close()
	var out []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			b.t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		b.t.Fatal(err)
	}
	return out
}

// TestPriorityBacklog: with a backlog of 10,000 priority-4 tasks already
// published, 100 priority-1 tasks created after them all start before 90%
// of the backlog has. The position is read from the audit trail: how many
// backlog tasks started before the last priority-1 task did.
func TestPriorityBacklog(t *testing.T) {
	t.Parallel()
	const backlog, urgent = 10_000, 100
	b := newServiceBundle(t)
	gate := make(chan struct{})
	cfg := b.fastConfig("w1")
	cfg.Concurrency = 8
	cfg.Relay.BatchSize = 500
	b.run(cfg, map[string]ingest.Handler{"k": func(ctx context.Context, _ ingest.Task) error {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return nil
	}}, slog.LevelError)

	b.createPriority("k", 4, backlog)
	testenv.Eventually(t, 120*time.Second, "the backlog published to the priority-4 stream", func() bool {
		return b.xlen(stream.Key(b.stream, 4)) == backlog
	})
	ids := b.createPriority("k", 1, urgent)
	testenv.Eventually(t, 60*time.Second, "the urgent tasks published to the priority-1 stream", func() bool {
		return b.xlen(stream.Key(b.stream, 1)) == urgent
	})
	if n := b.xlen(b.stream); n != 0 {
		t.Errorf("the default stream holds %d entries, want none", n)
	}
	// Before the gate opens, at most Concurrency backlog tasks started
	// (they hold the slots); they are not counted against the urgent ones.
	early := len(b.startOrder())
	close(gate)

	isUrgent := map[uuid.UUID]bool{}
	for _, id := range ids {
		isUrgent[id] = true
	}
	var order []uuid.UUID
	testenv.Eventually(t, 120*time.Second, "every urgent task started", func() bool {
		order = b.startOrder()
		n := 0
		for _, id := range order {
			if isUrgent[id] {
				n++
			}
		}
		return n == urgent
	})
	before, seen := 0, 0
	for _, id := range order {
		if isUrgent[id] {
			if seen++; seen == urgent {
				break
			}
			continue
		}
		before++
	}
	t.Logf("backlog tasks started before the last of %d urgent ones: %d of %d (%.1f%%); %d of them held the slots before the urgent ones existed",
		urgent, before, backlog, 100*float64(before)/backlog, early)
	if before >= backlog*9/10 {
		t.Fatalf("%d backlog tasks started before the last urgent one, want fewer than %d", before, backlog*9/10)
	}
}
