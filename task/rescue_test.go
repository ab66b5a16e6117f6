package task_test

import (
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// TestRescueWindowEndsAtTheGrace: a rescuer page reads no task created
// less than the grace ago (none of them could be eligible), so a page does
// not walk the last grace's tasks, finished or not; with a zero grace the
// same tasks are read.
func TestRescueWindowEndsAtTheGrace(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	for range 3 {
		b.create(t, task.NewTask{Kind: "young"})
	}
	page, err := task.RescueCandidates(b.ctx, b.db, task.RescueQueued, task.RescueCursor{}, 100, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Candidates) != 0 || page.More {
		t.Errorf("with a grace of an hour, a page of tasks created now: %d candidates (more: %v), want none", len(page.Candidates), page.More)
	}
	page, err = task.RescueCandidates(b.ctx, b.db, task.RescueQueued, task.RescueCursor{}, 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Candidates) != 3 {
		t.Errorf("with no grace: %d candidates, want the 3 tasks", len(page.Candidates))
	}
}
