package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
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

// TestPriorityReclaim: an entry of the priority-1 stream left pending by a
// consumer that crashed is claimed by a live worker's reclaimer and its
// task runs; its entry is acknowledged in the priority-1 stream. A task
// that dies there is dead-lettered from the priority-1 stream.
func TestPriorityReclaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	g, err := stream.NewGroup(stream.Config{Stream: b.stream, Consumer: "crashed"}, b.rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	key := stream.Key(b.stream, 1)
	var ids []uuid.UUID
	for _, kind := range []string{"k", "broken"} {
		res, err := b.store.Create(ctx, task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`), Priority: 1, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		id := res.Task.ID
		ids = append(ids, id)
		// Published as the relay would (the row names the priority-1
		// stream), then read by a consumer that crashed.
		entryID, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: stream.Entry{TaskID: id, Kind: kind}.Values()}).Result()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'SENT', stream = $2, stream_id = $3, sent_at = now() WHERE task_id = $1`,
			id, key, entryID); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: stream.DefaultGroup, Consumer: "crashed",
		Streams: []string{key, ">"}, Count: 10, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	var runs sync.Map
	b.run(b.fastConfig("w1"), map[string]ingest.Handler{
		"k": func(_ context.Context, tk ingest.Task) error {
			n, _ := runs.LoadOrStore(tk.ID, new(int))
			*n.(*int)++
			return nil
		},
		"broken": func(context.Context, ingest.Task) error { return ingest.Permanent(fmt.Errorf("broken")) },
	}, slog.LevelError)
	testenv.Eventually(t, 30*time.Second, "both tasks finished", func() bool {
		a, _ := b.store.Get(ctx, ids[0])
		d, _ := b.store.Get(ctx, ids[1])
		return a.Status == task.Succeeded && d.Status == task.Dead
	})
	testenv.Eventually(t, 10*time.Second, "nothing pending on the priority-1 stream", func() bool {
		_, pending, err := g.StatsOf(ctx, key)
		return err == nil && pending == 0
	})
	if n, ok := runs.Load(ids[0]); !ok || *n.(*int) != 1 {
		t.Errorf("task k ran %v times, want once", n)
	}
	dead, err := b.rdb.XRange(ctx, b.dlq, "-", "+").Result()
	if err != nil || len(dead) != 1 || dead[0].Values["task_id"] != ids[1].String() {
		t.Fatalf("DLQ = %v, %v; want the broken task", dead, err)
	}
	if p, _ := stream.SplitID(dead[0].Values["source_id"].(string)); p != 1 {
		t.Errorf("DLQ source_id %v: want a priority-1 message id", dead[0].Values["source_id"])
	}
}

// TestKafkaPriorityStoredNotRouted: Kafka mode stores and shows a task's
// priority but publishes every task to the one task topic (docs/KAFKA.md
// "Priorities"): tasks of every priority run, and each published outbox
// row names the task topic.
func TestKafkaPriorityStoredNotRouted(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 2, task.Config{})
	w, _ := kb.worker(ingest.Config{}, map[string]ingest.Handler{"k": func(context.Context, ingest.Task) error { return nil }})
	kb.relay()
	kb.run(w)
	var ids []uuid.UUID
	for _, p := range stream.Priorities {
		res, err := kb.store.Create(kb.ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), Priority: p})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Task.ID)
	}
	testenv.Eventually(t, 30*time.Second, "every task SUCCEEDED", func() bool { return kb.countStatus(task.Succeeded) == len(ids) })
	for i, id := range ids {
		if got := kb.task(id).Priority; got != stream.Priorities[i] {
			t.Errorf("task %s: priority %d, want %d", id, got, stream.Priorities[i])
		}
		var topics []string
		if err := kb.db.QueryRow(kb.ctx, `SELECT array_agg(DISTINCT stream) FROM outbox_event WHERE task_id = $1 AND status = 'SENT'`, id).Scan(&topics); err != nil {
			t.Fatal(err)
		}
		if len(topics) != 1 || topics[0] != kafka.DefaultTopic {
			t.Errorf("task %s (priority %d) published to %v, want the task topic only", id, stream.Priorities[i], topics)
		}
	}
}
