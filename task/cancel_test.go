package task_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// cancel cancels id as "api:test" and fails the test unless the outcome is
// want.
func (b *bundle) cancel(t *testing.T, id uuid.UUID, reason string, want task.CancelOutcome) task.CancelResult {
	t.Helper()
	r, err := b.store.Cancel(b.ctx, "api:test", reason, id)
	if err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if r.Outcome != want {
		t.Fatalf("Cancel outcome = %s, want %s (task %+v)", r.Outcome, want, r.Task)
	}
	return r
}

// wantCancelledAudit checks that the newest audit row of id is from →
// CANCELLED by the actor, carrying the reason.
func (b *bundle) wantCancelledAudit(t *testing.T, id uuid.UUID, from task.State, reason string) transition.Record {
	t.Helper()
	rec := b.lastTransition(t, id)
	want := "cancelled"
	if reason != "" {
		want += ": " + reason
	}
	if rec.From != string(from) || rec.To != string(task.Cancelled) || rec.Worker != "api:test" || rec.Message != want {
		t.Fatalf("last transition = %+v; want %s -> CANCELLED by api:test with message %q", rec, from, want)
	}
	return rec
}

// TestCancelWaiting: a QUEUED or RETRYING task (due or not) is CANCELLED
// at once by one statement with its audit row, and never starts again.
func TestCancelWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	cases := []struct {
		name string
		make func(t *testing.T) uuid.UUID
		from task.State
	}{
		{"Queued", func(t *testing.T) uuid.UUID { return b.create(t, task.NewTask{}).ID }, task.Queued},
		{"RetryingDue", func(t *testing.T) uuid.UUID {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			b.fail(t, "w1", task.Failure{ID: id, Error: "boom", RetryAfter: time.Microsecond})
			return id
		}, task.Retrying},
		{"RetryingNotDue", func(t *testing.T) uuid.UUID {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			b.fail(t, "w1", task.Failure{ID: id, Error: "boom", RetryAfter: time.Hour})
			b.start(t, "w2", time.Minute, id, task.NotDue)
			return id
		}, task.Retrying},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			id := c.make(t)
			before := b.get(t, id)
			r := b.cancel(t, id, "not needed", task.CancelDone)
			tk := b.get(t, id)
			if r.Task.Status != task.Cancelled || tk.Status != task.Cancelled || tk.FinishedAt == nil || tk.NextRetryAt != nil ||
				tk.AttemptCount != before.AttemptCount || tk.CancelReason != "not needed" || tk.CancelRequestedBy != "api:test" || tk.CancelRequestedAt == nil {
				t.Fatalf("after cancel: result %+v, task %+v", r.Task, tk)
			}
			rec := b.wantCancelledAudit(t, id, c.from, "not needed")
			if rec.AttemptCount != before.AttemptCount {
				t.Fatalf("audit attempt_count %d, want %d", rec.AttemptCount, before.AttemptCount)
			}
			r2 := b.start(t, "w3", time.Minute, id, task.Finished)
			if r2.Task.Status != task.Cancelled {
				t.Fatalf("start after cancel = %+v", r2.Task)
			}
			b.cancel(t, id, "again", task.CancelRefused)
		})
	}
}

// TestCancelRunning: a RUNNING task gets a cancel request (no state change,
// no audit row), announced on the NOTIFY channel and reported by Renew;
// its completion, whatever the handler returned, writes CANCELLED with the
// cancel's actor and reason.
func TestCancelRunning(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(5))
	ctx, stop := context.WithCancel(b.ctx)
	defer stop()
	heard := make(chan uuid.UUID, 16)
	listening := make(chan struct{})
	go func() {
		_ = b.store.ListenCancels(ctx, func() { close(listening) }, func(id uuid.UUID) { heard <- id })
	}()
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatal("ListenCancels did not start listening")
	}
	type complete func(id uuid.UUID) ([]task.Result, error)
	completions := []struct {
		name string
		do   complete
	}{
		{"Succeed", func(id uuid.UUID) ([]task.Result, error) { return b.store.Succeed(b.ctx, "w1", id) }},
		{"Fail", func(id uuid.UUID) ([]task.Result, error) {
			return b.store.Fail(b.ctx, "w1", task.Failure{ID: id, Error: "context canceled"})
		}},
		{"FailPermanent", func(id uuid.UUID) ([]task.Result, error) {
			return b.store.Fail(b.ctx, "w1", task.Failure{ID: id, Error: "context canceled", Permanent: true})
		}},
		{"Release", func(id uuid.UUID) ([]task.Result, error) { return b.store.Release(b.ctx, "w1", id) }},
	}
	for _, c := range completions { // not parallel: they share the listener
		t.Run(c.name, func(t *testing.T) {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			b.fail(t, "w1", task.Failure{ID: id, Error: "first run", RetryAfter: time.Microsecond})
			b.startWhenDue(t, "w1", time.Minute, id)
			nAudit := len(b.transitions(t, id))

			r := b.cancel(t, id, "stop it", task.CancelRequested)
			if r.Task.Status != task.Running || r.Task.CancelRequestedAt == nil || r.Task.CancelReason != "stop it" {
				t.Fatalf("cancel of a running task returned %+v", r.Task)
			}
			if n := len(b.transitions(t, id)); n != nAudit {
				t.Fatalf("a cancel request wrote %d audit rows, want none", n-nAudit)
			}
			select {
			case got := <-heard:
				if got != id {
					t.Fatalf("NOTIFY carried %s, want %s", got, id)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no NOTIFY on the cancel channel")
			}
			// Asking again keeps the first reason and actor.
			if r2, err := b.store.Cancel(b.ctx, "cli:other", "second", id); err != nil || r2.Outcome != task.CancelRequested ||
				r2.Task.CancelReason != "stop it" || r2.Task.CancelRequestedBy != "api:test" {
				t.Fatalf("second cancel = %+v, %v", r2, err)
			}
			<-heard
			renewed, cancel, err := b.store.Renew(b.ctx, "w1", time.Minute, id)
			if err != nil || len(renewed) != 1 || len(cancel) != 1 || cancel[0] != id {
				t.Fatalf("Renew = %v, %v, %v; want the id renewed and cancel-requested", renewed, cancel, err)
			}

			rs, err := c.do(id)
			if err != nil || len(rs) != 1 || !rs[0].Applied || rs[0].Status != task.Cancelled {
				t.Fatalf("%s of a cancel-requested task = %+v, %v; want applied, CANCELLED", c.name, rs, err)
			}
			tk := b.get(t, id)
			if tk.Status != task.Cancelled || tk.AttemptCount != 1 || tk.LastError != "first run" || tk.FinishedAt == nil ||
				tk.NextRetryAt != nil || tk.LeaseOwner != "" {
				t.Fatalf("task after the cancelled run's completion = %+v; want CANCELLED, the run not counted, its error not stored", tk)
			}
			b.wantCancelledAudit(t, id, task.Running, "stop it")
		})
	}
}

// TestCancelExpiredLease: a RUNNING task whose lease expired is CANCELLED
// at once (its worker is taken for dead; a late completion is a conflict),
// and a takeover of a cancel-requested task whose worker died cancels it.
func TestCancelExpiredLease(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	t.Run("CancelAfterExpiry", func(t *testing.T) {
		t.Parallel()
		id := b.create(t, task.NewTask{}).ID
		b.start(t, "w1", time.Minute, id, task.Started)
		b.expireLease(t, id)
		b.cancel(t, id, "", task.CancelDone)
		b.wantCancelledAudit(t, id, task.Running, "")
		if rs, err := b.store.Succeed(b.ctx, "w1", id); err != nil || rs[0].Applied || rs[0].Status != task.Cancelled {
			t.Fatalf("late Succeed = %+v, %v; want a conflict", rs, err)
		}
	})
	t.Run("TakeoverOfRequested", func(t *testing.T) {
		t.Parallel()
		id := b.create(t, task.NewTask{}).ID
		b.start(t, "w1", time.Minute, id, task.Started)
		b.cancel(t, id, "bye", task.CancelRequested)
		b.expireLease(t, id)
		r := b.start(t, "w2", time.Minute, id, task.CancelledOnTakeover)
		if r.Task.Status != task.Cancelled || r.Task.AttemptCount != 0 {
			t.Fatalf("takeover of a cancel-requested task = %+v, task %+v; want CANCELLED, no attempt counted", r, r.Task)
		}
		b.wantCancelledAudit(t, id, task.Running, "bye")
	})
}

// TestCancelTerminalAndUnknown: a terminal task is refused and left
// unchanged; an unknown id is ErrNotFound; bad input names the field.
func TestCancelTerminalAndUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{MaxAttempts: 1})
	succeeded := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, succeeded, task.Started)
	if _, err := b.store.Succeed(b.ctx, "w1", succeeded); err != nil {
		t.Fatal(err)
	}
	dead := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, dead, task.Started)
	b.fail(t, "w1", task.Failure{ID: dead, Error: "boom"})
	cancelled := b.create(t, task.NewTask{}).ID
	b.cancel(t, cancelled, "", task.CancelDone)
	for _, id := range []uuid.UUID{succeeded, dead, cancelled} {
		before := b.snapshot(t, id)
		r := b.cancel(t, id, "late", task.CancelRefused)
		if !r.Task.Status.Terminal() || r.Task.ID != id {
			t.Fatalf("refused cancel returned %+v", r.Task)
		}
		if after := b.snapshot(t, id); after != before {
			t.Fatalf("a refused cancel changed the task:\nbefore %+v\nafter  %+v", before, after)
		}
	}
	if _, err := b.store.Cancel(b.ctx, "api:test", "", uuid.New()); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("Cancel of an unknown id = %v, want ErrNotFound", err)
	}
	id := b.create(t, task.NewTask{}).ID
	if _, err := b.store.Cancel(b.ctx, "api:test", strings.Repeat("x", task.MaxCancelReasonBytes+1), id); !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), "reason") {
		t.Fatalf("Cancel with a long reason = %v, want ErrInvalidTask naming the reason", err)
	}
	if _, err := b.store.Cancel(b.ctx, "", "", id); !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), "actor") {
		t.Fatalf("Cancel without an actor = %v, want ErrInvalidTask naming the actor", err)
	}
}

// TestRedriveCancelled: a CANCELLED task is redriven like a DEAD one: back
// to QUEUED, attempts reset, cancel request cleared, a new outbox row, and
// an audit row from CANCELLED by the actor.
func TestRedriveCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(5))
	id := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, id, task.Started)
	b.cancel(t, id, "oops", task.CancelRequested)
	if _, err := b.store.Fail(b.ctx, "w1", task.Failure{ID: id, Error: "context canceled"}); err != nil {
		t.Fatal(err)
	}
	outbox := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id)
	rs, err := b.store.Redrive(b.ctx, "cli:op", id)
	if err != nil || !rs[0].Applied || rs[0].Status != task.Queued {
		t.Fatalf("Redrive of a CANCELLED task = %+v, %v", rs, err)
	}
	tk := b.get(t, id)
	if tk.Status != task.Queued || tk.CancelRequestedAt != nil || tk.CancelReason != "" || tk.CancelRequestedBy != "" || tk.FinishedAt != nil {
		t.Fatalf("task after redrive = %+v", tk)
	}
	if rec := b.lastTransition(t, id); rec.From != string(task.Cancelled) || rec.To != string(task.Queued) || rec.Worker != "cli:op" || rec.Message != "redrive" {
		t.Fatalf("redrive audit row = %+v", rec)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id); n != outbox+1 {
		t.Fatalf("%d outbox rows after redrive, want %d", n, outbox+1)
	}
	// It runs again, and a fresh run is not cancelled.
	b.start(t, "w2", time.Minute, id, task.Started)
	if rs, err := b.store.Succeed(b.ctx, "w2", id); err != nil || rs[0].Status != task.Succeeded {
		t.Fatalf("Succeed after redrive = %+v, %v", rs, err)
	}
}

// TestCancelRacesCompletion runs many cancel/complete pairs at the same
// moment: exactly one terminal state wins, what each caller was told
// agrees with it, and the audit trail has exactly one terminal row.
func TestCancelRacesCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(5))
	const pairs = 60
	var mu sync.Mutex
	wins := map[string]int{}
	for i := range pairs {
		id := b.create(t, task.NewTask{}).ID
		b.start(t, "w1", time.Minute, id, task.Started)
		var cres task.CancelResult
		var done []task.Result
		var cerr, derr error
		race(2, func(j int) {
			if j == 0 {
				cres, cerr = b.store.Cancel(b.ctx, "api:test", "race", id)
				return
			}
			if i%2 == 0 {
				done, derr = b.store.Succeed(b.ctx, "w1", id)
			} else {
				done, derr = b.store.Fail(b.ctx, "w1", task.Failure{ID: id, Error: "boom"})
			}
		})
		if cerr != nil || derr != nil {
			t.Fatalf("pair %d: cancel %v, completion %v", i, cerr, derr)
		}
		tk := b.get(t, id)
		completed := task.Succeeded
		if i%2 == 1 {
			completed = task.Retrying
		}
		if !done[0].Applied {
			t.Fatalf("pair %d: completion not applied: %+v", i, done[0])
		}
		switch cres.Outcome {
		case task.CancelRefused: // the success committed first
			if completed != task.Succeeded || tk.Status != task.Succeeded || done[0].Status != task.Succeeded {
				t.Fatalf("pair %d: cancel refused, completion %s, task %s", i, done[0].Status, tk.Status)
			}
		case task.CancelRequested: // the cancel committed first: the completion wrote CANCELLED
			if tk.Status != task.Cancelled || done[0].Status != task.Cancelled {
				t.Fatalf("pair %d: cancel requested, completion %s, task %s", i, done[0].Status, tk.Status)
			}
		case task.CancelDone: // the failure made it RETRYING first, then the cancel ended it
			if completed != task.Retrying || done[0].Status != task.Retrying || tk.Status != task.Cancelled {
				t.Fatalf("pair %d: cancel done, completion %s, task %s", i, done[0].Status, tk.Status)
			}
		default:
			t.Fatalf("pair %d: cancel outcome %q", i, cres.Outcome)
		}
		recs := b.transitions(t, id)
		terminal := 0
		for k, r := range recs {
			if k > 0 && (r.From != recs[k-1].To || !task.CanTransition(task.State(r.From), task.State(r.To))) {
				t.Fatalf("pair %d: bad audit trail %+v", i, recs)
			}
			if task.State(r.To).Terminal() {
				terminal++
			}
		}
		if last := recs[len(recs)-1]; task.State(last.To) != tk.Status {
			t.Fatalf("pair %d: last audit row %+v, task %s", i, last, tk.Status)
		}
		if tk.Status.Terminal() && terminal != 1 {
			t.Fatalf("pair %d: %d terminal audit rows: %+v", i, terminal, recs)
		}
		mu.Lock()
		wins[string(cres.Outcome)+"/"+string(tk.Status)]++
		mu.Unlock()
	}
	t.Logf("outcomes (cancel/final status): %v", wins)
}

// TestListenCancelsNeedsPool: a store on something else than a pool
// cannot open a listener connection, and says so.
func TestListenCancelsNeedsPool(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	conn, err := db.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	s, err := task.NewStore(task.Config{}, conn.Conn())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ListenCancels(context.Background(), func() {}, func(uuid.UUID) {}); !errors.Is(err, task.ErrNoListen) {
		t.Fatalf("ListenCancels on a single connection = %v, want ErrNoListen", err)
	}
}
