package task_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestDeleteTerminal: a terminal task is deleted with its audit and outbox
// rows in one statement; a live one is kept and reported with its state;
// an unknown id has no result (Store.Delete: ErrNotFound).
func TestDeleteTerminal(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	done := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, done, task.Started)
	if _, err := b.store.Succeed(b.ctx, "w1", done); err != nil {
		t.Fatal(err)
	}
	cancelled := b.create(t, task.NewTask{}).ID
	b.cancel(t, cancelled, "", task.CancelDone)
	queued := b.create(t, task.NewTask{}).ID
	running := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, running, task.Started)
	unknown := uuid.New()

	res, err := task.DeleteTerminal(b.ctx, b.db, []uuid.UUID{done, cancelled, queued, running, unknown, done})
	if err != nil {
		t.Fatalf("DeleteTerminal: %v", err)
	}
	got := map[uuid.UUID]task.DeleteResult{}
	for _, r := range res {
		got[r.ID] = r
	}
	if len(res) != 4 {
		t.Fatalf("DeleteTerminal returned %d results, want 4: %+v", len(res), res)
	}
	for id, want := range map[uuid.UUID]task.DeleteResult{
		done:      {ID: done, Status: task.Succeeded, Deleted: true},
		cancelled: {ID: cancelled, Status: task.Cancelled, Deleted: true},
		queued:    {ID: queued, Status: task.Queued},
		running:   {ID: running, Status: task.Running},
	} {
		if !reflect.DeepEqual(got[id], want) {
			t.Errorf("result of %s = %+v, want %+v", id, got[id], want)
		}
	}
	for _, id := range []uuid.UUID{done, cancelled} {
		for _, q := range []string{
			`SELECT count(*) FROM ingest_task WHERE id = $1`,
			`SELECT count(*) FROM ingest_task_transition WHERE task_id = $1`,
			`SELECT count(*) FROM outbox_event WHERE task_id = $1`,
		} {
			if n := b.count(t, q, id); n != 0 {
				t.Errorf("%s for deleted %s: %d, want 0", q, id, n)
			}
		}
	}
	for _, id := range []uuid.UUID{queued, running} {
		if n := b.count(t, `SELECT count(*) FROM ingest_task_transition WHERE task_id = $1`, id); n == 0 {
			t.Errorf("live task %s lost its audit rows", id)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id); n == 0 {
			t.Errorf("live task %s lost its outbox rows", id)
		}
	}

	if _, err := b.store.Delete(b.ctx, unknown); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("Delete(unknown) error = %v, want ErrNotFound", err)
	}
	r, err := b.store.Delete(b.ctx, queued)
	if err != nil || r.Deleted || r.Status != task.Queued {
		t.Errorf("Delete(queued) = %+v, %v; want kept QUEUED", r, err)
	}
}

// TestRunNow: a QUEUED task delayed until later becomes due at once, with
// an audit row naming the actor, its delayed outbox row replaced by one
// due now; a task already due, a running or terminal one and a parked one
// are refused and unchanged (a parked task
// is due already; it waits for its kind's resume or a free slot, which
// run-now does not override).
func TestRunNow(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	later := time.Now().Add(time.Hour)
	id := b.create(t, task.NewTask{RunAt: later}).ID

	r, err := b.store.RunNow(b.ctx, "cli:test", id)
	if err != nil {
		t.Fatalf("RunNow: %v", err)
	}
	if r.Outcome != task.RunNowDone || r.Status != task.Queued || r.NextRetryAt == nil {
		t.Fatalf("RunNow = %+v, want DUE from QUEUED with the old due time", r)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE id = $1 AND next_retry_at <= now()`, id); n != 1 {
		t.Fatalf("task not due after RunNow")
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id); n != 1 {
		t.Errorf("outbox rows of the task = %d, want 1 (the delayed row replaced)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND next_retry_at <= now()`, id); n != 1 {
		t.Errorf("the task's outbox row is not due now")
	}
	rec := b.lastTransition(t, id)
	if rec.From != "QUEUED" || rec.To != "QUEUED" || rec.Worker != "cli:test" || rec.Message != task.RunNowMessage {
		t.Errorf("last transition = %+v, want QUEUED -> QUEUED by cli:test, %q", rec, task.RunNowMessage)
	}
	b.start(t, "w1", time.Minute, id, task.Started)

	again, err := b.store.RunNow(b.ctx, "cli:test", id)
	if err != nil || again.Outcome != task.RunNowNotWaiting || again.Status != task.Running {
		t.Errorf("RunNow(running) = %+v, %v; want NOT_WAITING", again, err)
	}
	retrying := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, retrying, task.Started)
	b.fail(t, "w1", task.Failure{ID: retrying, Error: "boom", RetryAfter: time.Hour})
	if r, err := b.store.RunNow(b.ctx, "cli:test", retrying); err != nil || r.Outcome != task.RunNowDone || r.Status != task.Retrying {
		t.Errorf("RunNow(retrying later) = %+v, %v; want DUE from RETRYING", r, err)
	}
	b.start(t, "w2", time.Minute, retrying, task.Started)
	due := b.create(t, task.NewTask{}).ID
	if r, err := b.store.RunNow(b.ctx, "cli:test", due); err != nil || r.Outcome != task.RunNowAlreadyDue {
		t.Errorf("RunNow(due) = %+v, %v; want ALREADY_DUE", r, err)
	}
	if _, err := b.store.SetPaused(b.ctx, "cli:test", "paused", true); err != nil {
		t.Fatal(err)
	}
	parked := b.create(t, task.NewTask{Kind: "paused"}).ID
	if p, err := b.store.Park(b.ctx, parked); err != nil || len(p) != 1 {
		t.Fatalf("Park = %v, %v", p, err)
	}
	if r, err := b.store.RunNow(b.ctx, "cli:test", parked); err != nil || r.Outcome != task.RunNowParked {
		t.Errorf("RunNow(parked) = %+v, %v; want PARKED", r, err)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task_transition WHERE task_id = $1 AND message = $2`, parked, task.RunNowMessage); n != 0 {
		t.Errorf("a refused RunNow wrote an audit row")
	}
	if _, err := b.store.RunNow(b.ctx, "cli:test", uuid.New()); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("RunNow(unknown) error = %v, want ErrNotFound", err)
	}
}

// TestRunNowIsNoRetryInTheCharts: the audit row of a run-now (RETRYING to
// RETRYING) is no failure: AuditSamples, which feeds the dashboard's
// retried-per-minute chart, counts the failure that made the task RETRYING
// once, not the run-now.
func TestRunNowIsNoRetryInTheCharts(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	id := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, id, task.Started)
	b.fail(t, "w1", task.Failure{ID: id, Error: "boom", RetryAfter: time.Hour})
	if r, err := b.store.RunNow(b.ctx, "cli:test", id); err != nil || r.Outcome != task.RunNowDone {
		t.Fatalf("RunNow = %+v, %v", r, err)
	}
	samples, err := task.AuditSamples(b.ctx, b.db, 0, time.Now().Add(-time.Hour), 1000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var retried int64
	for _, s := range samples {
		if s.To == task.Retrying {
			retried += s.N
		}
	}
	if retried != 1 {
		t.Fatalf("RETRYING samples count %d rows, want 1 (the failure, not the run-now): %+v", retried, samples)
	}
}
