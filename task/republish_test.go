package task_test

import (
	"encoding/json"
	"testing"

	"github.com/ingest-worker/ingest/task"
)

// TestRedriveRepublishesTaskWhoseOutboxRowIsDead: a QUEUED task whose
// latest outbox row went DEAD (publishing gave up) is redriven by a new
// outbox row, keeping its state and writing no transition; a QUEUED task
// whose row is still unsent is refused, as before.
func TestRedriveRepublishesTaskWhoseOutboxRowIsDead(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	stuck := b.create(t, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
	waiting := b.create(t, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"n":2}`)})
	if _, err := b.db.Exec(b.ctx, `UPDATE outbox_event SET status = 'DEAD', attempt_count = 10, next_retry_at = NULL WHERE task_id = $1`, stuck.ID); err != nil {
		t.Fatal(err)
	}
	before := len(b.transitions(t, stuck.ID))
	res, err := b.store.Redrive(b.ctx, "operator", stuck.ID, waiting.ID)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]task.Result{}
	for _, r := range res {
		byID[r.ID.String()] = r
	}
	if r := byID[stuck.ID.String()]; !r.Applied || r.Status != task.Queued {
		t.Errorf("redrive of the stuck task: %+v, want applied, QUEUED", r)
	}
	if r := byID[waiting.ID.String()]; r.Applied {
		t.Errorf("redrive of a QUEUED task with an unsent outbox row: %+v, want refused", r)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND status = 'NEW'`, stuck.ID); n != 1 {
		t.Errorf("stuck task: %d new outbox rows, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, waiting.ID); n != 1 {
		t.Errorf("waiting task: %d outbox rows, want still 1", n)
	}
	if got := b.get(t, stuck.ID); got.Status != task.Queued {
		t.Errorf("stuck task is %s, want QUEUED", got.Status)
	}
	if after := len(b.transitions(t, stuck.ID)); after != before {
		t.Errorf("%d transitions after the redrive, want %d: the state did not change", after, before)
	}
	// A second redrive finds the new row unsent and refuses.
	res, err = b.store.Redrive(b.ctx, "operator", stuck.ID)
	if err != nil || res[0].Applied {
		t.Errorf("second redrive: %+v, %v; want refused", res, err)
	}
}
