package task_test

import (
	"maps"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// TestLiveCounts: one walk counts the unfinished tasks by state and by
// kind, exactly while it read fewer than its limit; at the limit it says
// the counts may be short.
func TestLiveCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	a1 := b.create(t, task.NewTask{Kind: "a"})
	b.create(t, task.NewTask{Kind: "a"})
	b.create(t, task.NewTask{Kind: "a"})
	b.create(t, task.NewTask{Kind: "b"})
	b.start(t, "w", time.Minute, a1.ID, task.Started)
	done := b.create(t, task.NewTask{Kind: "b"})
	b.start(t, "w", time.Minute, done.ID, task.Started)
	if _, err := b.store.Succeed(b.ctx, "w", done.ID); err != nil {
		t.Fatal(err)
	}

	byState, byKind, complete, err := task.LiveCounts(b.ctx, b.db, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[task.State]int64{task.Queued: 3, task.Running: 1}; !complete || !maps.Equal(byState, want) {
		t.Errorf("by state %v (complete: %v), want %v and complete", byState, complete, want)
	}
	if !maps.Equal(byKind["a"], map[task.State]int64{task.Queued: 2, task.Running: 1}) || !maps.Equal(byKind["b"], map[task.State]int64{task.Queued: 1}) {
		t.Errorf("by kind %v, want a: 2 queued, 1 running; b: 1 queued", byKind)
	}
	if _, _, complete, err := task.LiveCounts(b.ctx, b.db, 4); err != nil || complete {
		t.Errorf("with a limit of 4 and 4 unfinished tasks: complete %v, %v; want incomplete (there may be more)", complete, err)
	}
	if _, _, complete, err := task.LiveCounts(b.ctx, b.db, 5); err != nil || !complete {
		t.Errorf("with a limit of 5 and 4 unfinished tasks: complete %v, %v; want complete", complete, err)
	}
}
