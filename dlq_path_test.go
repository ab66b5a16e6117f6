package ingest_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// TestDeathReachesDLQOnceAfterCrashBeforeDLQWrite: a worker recorded DEAD
// in Postgres and died before its DLQ write (its entry stays pending), and
// the task has further entries (a duplicate, and the outbox's own). The
// death reaches the DLQ exactly once and every entry is acknowledged.
func TestDeathReachesDLQOnceAfterCrashBeforeDLQWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	created, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Task.ID
	fields := map[string]any{"task_id": id.String(), "kind": "k"}
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, ingest.DefaultGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: fields}).Err(); err != nil {
		t.Fatal(err)
	}
	// The ghost worker reads the entry, runs the task and records DEAD...
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: ingest.DefaultGroup, Consumer: "ghost",
		Streams: []string{b.stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := b.store.Start(ctx, "ghost", time.Minute, id); err != nil || r[0].Outcome != task.Started {
		t.Fatalf("start: %+v %v", r, err)
	}
	if r, err := b.store.Fail(ctx, "ghost", task.Failure{ID: id, Error: "boom", Permanent: true}); err != nil || r[0].Status != task.Dead {
		t.Fatalf("fail: %+v %v", r, err)
	}
	// ...and dies before its DLQ write. A duplicate entry is on its way.
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: fields}).Err(); err != nil {
		t.Fatal(err)
	}

	// Retention stays off: its trimming would drop the acknowledged entries
	// the wait below counts.
	cfg := b.fastConfig("w1")
	cfg.Maintenance.RetentionDisabled = true
	b.start(cfg, func(context.Context, ingest.Task) error { return nil })
	b.eventually(30*time.Second, "every entry acknowledged and the outbox row sent", func() bool {
		p, err := b.rdb.XPending(ctx, b.stream, ingest.DefaultGroup).Result()
		if err != nil || p.Count != 0 {
			return false
		}
		n, err := b.rdb.XLen(ctx, b.stream).Result()
		return err == nil && n >= 3 // ghost's, the duplicate, the relay's
	})
	// Settling is done once nothing is pending; the DLQ must hold the death once.
	entries, err := b.rdb.XRange(ctx, b.dlq, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Values["task_id"] != id.String() {
		t.Fatalf("DLQ holds %d entries %v, want exactly one for task %s", len(entries), entries, id)
	}
	if got := entries[0].Values["last_error"]; got != "boom" {
		t.Errorf("DLQ last_error %q, want boom", got)
	}
}
