package ingest_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
)

// TestPauseAndResumeKind: with two workers running, a paused kind's tasks
// start nowhere: they are parked (no failed attempt, nothing left pending,
// so no consumer slot is held) while another kind's tasks all run; a
// resume publishes the parked tasks and they all run once.
func TestPauseAndResumeKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	var pRuns, kRuns atomic.Int64
	// Paused before the workers start: they read the paused kinds at
	// their first read (then once a second).
	if _, err := b.store.SetPaused(ctx, "test", "p", true); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"w1", "w2"} {
		b.run(b.fastConfig(name), map[string]ingest.Handler{
			"p": func(context.Context, ingest.Task) error { pRuns.Add(1); return nil },
			"k": func(context.Context, ingest.Task) error { kRuns.Add(1); return nil },
		}, slog.LevelError)
	}
	b.createKind("p", 200)
	b.createKind("k", 200)
	count := b.query
	b.eventually(30*time.Second, "k done, p parked, nothing pending", func() bool {
		p, err := b.rdb.XPending(ctx, b.stream, ingest.DefaultGroup).Result()
		return err == nil && p.Count == 0 &&
			count(`SELECT count(*) FROM ingest_task WHERE kind = 'k' AND status = 'SUCCEEDED'`) == 200 &&
			count(`SELECT count(*) FROM ingest_task WHERE kind = 'p' AND status = 'QUEUED' AND attempt_count = 0 AND parked_at IS NOT NULL`) == 200
	})
	if n := pRuns.Load(); n != 0 {
		t.Fatalf("%d tasks of the paused kind ran", n)
	}
	if n := kRuns.Load(); n != 200 {
		t.Fatalf("the other kind's 200 tasks ran %d times, want 200", n)
	}
	released, err := b.store.SetPaused(ctx, "test", "p", false)
	if err != nil || released != 200 {
		t.Fatalf("resume: %d released, %v; want 200", released, err)
	}
	b.eventually(30*time.Second, "every p task SUCCEEDED", func() bool {
		return count(`SELECT count(*) FROM ingest_task WHERE kind = 'p' AND status = 'SUCCEEDED'`) == 200
	})
	if n := pRuns.Load(); n != 200 {
		t.Fatalf("the paused kind's tasks ran %d times after the resume, want 200", n)
	}
	if n := count(`SELECT count(*) FROM ingest_task_transition t JOIN ingest_task k ON k.id = t.task_id WHERE k.kind = 'p' AND t.to_status = 'RETRYING'`); n != 0 {
		t.Fatalf("%d failed attempts of parked tasks", n)
	}
}
