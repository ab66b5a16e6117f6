package task_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

func TestAllowedTransitions(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(3))

	t.Run("Enqueue", func(t *testing.T) {
		t.Parallel()
		tk := b.create(t, task.NewTask{Kind: "enqueue"})
		if tk.Status != task.Queued || tk.AttemptCount != 0 || tk.MaxAttempts != nil || tk.EffectiveMaxAttempts(3) != 3 || tk.NextRetryAt != nil || tk.LeaseOwner != "" {
			t.Fatalf("created task = %+v, want QUEUED, 0 attempts, no limit of its own (the workers' applies), no retry time, no lease", tk)
		}
		recs := b.transitions(t, tk.ID)
		if len(recs) != 1 || recs[0].From != "" || recs[0].To != string(task.Queued) || recs[0].AttemptCount != 0 {
			t.Fatalf("transitions = %+v, want one (none) -> QUEUED", recs)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND status = 'NEW' AND stream = $2`, tk.ID, task.DefaultStream); n != 1 {
			t.Fatalf("%d NEW outbox events on %s, want 1", n, task.DefaultStream)
		}
	})

	tests := []struct {
		name     string
		max      int // max_attempts of the task; 0: the store's 3
		from, to task.State
		attempts int // attempt_count after the transition
		worker   string
		// prepare brings the task into state from; do makes the transition
		// and checks what is special about it.
		prepare func(t *testing.T, id uuid.UUID)
		do      func(t *testing.T, id uuid.UUID)
	}{
		{
			name: "QueuedToRunning", from: task.Queued, to: task.Running, attempts: 0, worker: "w1",
			prepare: func(t *testing.T, id uuid.UUID) {},
			do: func(t *testing.T, id uuid.UUID) {
				r := b.start(t, "w1", time.Minute, id, task.Started)
				tk := r.Task
				if tk.LeaseOwner != "w1" || string(tk.Payload) != `{"n": 1}` {
					t.Fatalf("start result = %+v, task %+v; want a plain start with w1's lease and the payload", r, tk)
				}
				if tk.LeaseUntil == nil || tk.LeaseUntil.Sub(tk.UpdatedAt) != time.Minute {
					t.Fatalf("lease_until = %v, want updated_at (%v) + 1m", tk.LeaseUntil, tk.UpdatedAt)
				}
			},
		},
		{
			name: "RetryingToRunning", from: task.Retrying, to: task.Running, attempts: 1, worker: "w1",
			prepare: func(t *testing.T, id uuid.UUID) { b.failTimes(t, id, 1) },
			do: func(t *testing.T, id uuid.UUID) {
				r := b.startWhenDue(t, "w1", time.Minute, id)
				if r.Outcome != task.Started || r.Task.NextRetryAt != nil {
					t.Fatalf("start result = %+v, want a plain start that clears next_retry_at", r)
				}
			},
		},
		{
			name: "RunningToRunningTakeover", from: task.Running, to: task.Running, attempts: 1, worker: "w2",
			prepare: func(t *testing.T, id uuid.UUID) {
				b.start(t, "w1", time.Minute, id, task.Started)
				b.expireLease(t, id)
			},
			do: func(t *testing.T, id uuid.UUID) {
				r := b.start(t, "w2", time.Minute, id, task.TakenOver)
				if r.Task.LeaseOwner != "w2" || !strings.Contains(r.Task.LastError, "w1") {
					t.Fatalf("takeover result = %+v, task %+v; want TAKEN_OVER under w2 naming w1's abandoned run", r, r.Task)
				}
			},
		},
		{
			name: "RunningToSucceeded", from: task.Running, to: task.Succeeded, attempts: 0, worker: "w1",
			prepare: func(t *testing.T, id uuid.UUID) { b.start(t, "w1", time.Minute, id, task.Started) },
			do: func(t *testing.T, id uuid.UUID) {
				rs, err := b.store.Succeed(b.ctx, "w1", id)
				if err != nil || len(rs) != 1 || !rs[0].Applied || rs[0].Status != task.Succeeded {
					t.Fatalf("Succeed = %+v, %v; want applied SUCCEEDED", rs, err)
				}
				tk := b.get(t, id)
				if tk.FinishedAt == nil || tk.LeaseOwner != "" || tk.LeaseUntil != nil {
					t.Fatalf("succeeded task = %+v, want finished_at set and no lease", tk)
				}
			},
		},
		{
			name: "RunningToRetryingOnFailure", from: task.Running, to: task.Retrying, attempts: 1, worker: "w1",
			prepare: func(t *testing.T, id uuid.UUID) { b.start(t, "w1", time.Minute, id, task.Started) },
			do: func(t *testing.T, id uuid.UUID) {
				r := b.fail(t, "w1", task.Failure{ID: id, Error: "upstream 503"})
				tk := b.get(t, id)
				if r.Status != task.Retrying || r.NextRetryAt == nil || r.LastError != "upstream 503" {
					t.Fatalf("Fail = %+v, want RETRYING with next_retry_at and the error", r)
				}
				if tk.LastError != "upstream 503" || tk.ErrorMessage != tk.LastError || tk.LeaseOwner != "" || tk.LeaseUntil != nil || tk.FinishedAt != nil {
					t.Fatalf("failed task = %+v, want the error in last_error and error_message, no lease, not finished", tk)
				}
				if rec := b.lastTransition(t, id); rec.Message != "upstream 503" {
					t.Fatalf("transition message = %q, want the error", rec.Message)
				}
			},
		},
		{
			name: "RunningToRetryingOnRelease", from: task.Running, to: task.Retrying, attempts: 0, worker: "w1",
			prepare: func(t *testing.T, id uuid.UUID) { b.start(t, "w1", time.Minute, id, task.Started) },
			do: func(t *testing.T, id uuid.UUID) {
				rs, err := b.store.Release(b.ctx, "w1", id)
				if err != nil || len(rs) != 1 || !rs[0].Applied || rs[0].Status != task.Retrying || rs[0].AttemptCount != 0 {
					t.Fatalf("Release = %+v, %v; want applied RETRYING without counting an attempt", rs, err)
				}
				tk := b.get(t, id)
				if tk.NextRetryAt == nil || tk.NextRetryAt.After(tk.UpdatedAt) || tk.LeaseOwner != "" {
					t.Fatalf("released task = %+v, want due at once and no lease", tk)
				}
				if rec := b.lastTransition(t, id); !strings.Contains(rec.Message, "released") {
					t.Fatalf("transition message = %q, want it to say released", rec.Message)
				}
			},
		},
		{
			name: "RunningToDeadExhausted", max: 2, from: task.Running, to: task.Dead, attempts: 2, worker: "w1",
			prepare: func(t *testing.T, id uuid.UUID) {
				b.failTimes(t, id, 1)
				b.startWhenDue(t, "w1", time.Minute, id)
			},
			do: func(t *testing.T, id uuid.UUID) {
				r := b.fail(t, "w1", task.Failure{ID: id, Error: "boom", RetryAfter: time.Hour})
				tk := b.get(t, id)
				if r.Status != task.Dead || tk.NextRetryAt != nil || tk.FinishedAt == nil || tk.LastError != "boom" {
					t.Fatalf("Fail = %+v, task %+v; want DEAD, finished, no retry time", r, tk)
				}
			},
		},
		{
			name: "RunningToDeadPermanent", from: task.Running, to: task.Dead, attempts: 1, worker: "w1",
			prepare: func(t *testing.T, id uuid.UUID) { b.start(t, "w1", time.Minute, id, task.Started) },
			do: func(t *testing.T, id uuid.UUID) {
				r := b.fail(t, "w1", task.Failure{ID: id, Error: "400 bad request", Permanent: true})
				if r.Status != task.Dead || r.NextRetryAt != nil {
					t.Fatalf("Fail = %+v, want DEAD at once", r)
				}
				if rec := b.lastTransition(t, id); rec.Message != "permanent: 400 bad request" {
					t.Fatalf("transition message = %q, want it marked permanent", rec.Message)
				}
			},
		},
		{
			name: "RunningToDeadOnTakeover", max: 1, from: task.Running, to: task.Dead, attempts: 1, worker: "w2",
			prepare: func(t *testing.T, id uuid.UUID) {
				b.start(t, "w1", time.Minute, id, task.Started)
				b.expireLease(t, id)
			},
			do: func(t *testing.T, id uuid.UUID) {
				r := b.start(t, "w2", time.Minute, id, task.DiedOnTakeover)
				if r.Task.Status != task.Dead || r.Task.LeaseOwner != "" || r.Task.FinishedAt == nil || r.Task.Payload != nil {
					t.Fatalf("takeover = %+v, task %+v; want Died, DEAD, finished, no lease, no payload", r, r.Task)
				}
			},
		},
		{
			name: "DeadToQueuedRedrive", from: task.Dead, to: task.Queued, attempts: 0, worker: "operator",
			prepare: func(t *testing.T, id uuid.UUID) {
				b.failTimes(t, id, 1)
				b.startWhenDue(t, "w1", time.Minute, id)
				b.fail(t, "w1", task.Failure{ID: id, Error: "gone", Permanent: true})
			},
			do: func(t *testing.T, id uuid.UUID) {
				rs, err := b.store.Redrive(b.ctx, "operator", id)
				if err != nil || len(rs) != 1 || !rs[0].Applied || rs[0].Status != task.Queued || rs[0].AttemptCount != 0 {
					t.Fatalf("Redrive = %+v, %v; want applied QUEUED with attempts reset", rs, err)
				}
				tk := b.get(t, id)
				if tk.FinishedAt != nil || tk.NextRetryAt != nil || tk.LastError != "gone" {
					t.Fatalf("redriven task = %+v, want not finished, no retry time, the last error kept", tk)
				}
				if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id); n != 2 {
					t.Fatalf("%d outbox events, want 2 (creation and redrive)", n)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if !task.CanTransition(tt.from, tt.to) {
				t.Fatalf("test case %s -> %s is not in the transition table", tt.from, tt.to)
			}
			id := b.create(t, task.NewTask{MaxAttempts: tt.max}).ID
			tt.prepare(t, id)
			if got := b.get(t, id).Status; got != tt.from {
				t.Fatalf("prepared task is %s, want %s", got, tt.from)
			}
			before := len(b.transitions(t, id))
			tt.do(t, id)
			tk := b.get(t, id)
			if tk.Status != tt.to || tk.AttemptCount != tt.attempts {
				t.Fatalf("task is %s with %d attempts, want %s with %d", tk.Status, tk.AttemptCount, tt.to, tt.attempts)
			}
			recs := b.transitions(t, id)
			if len(recs) != before+1 {
				t.Fatalf("%d transitions written, want exactly 1", len(recs)-before)
			}
			rec := recs[len(recs)-1]
			if rec.From != string(tt.from) || rec.To != string(tt.to) || rec.AttemptCount != tt.attempts || rec.Worker != tt.worker {
				t.Fatalf("transition = %+v, want %s -> %s, attempt %d, worker %s", rec, tt.from, tt.to, tt.attempts, tt.worker)
			}
		})
	}
}

func TestRefusedTransitions(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(3))

	// Each state is made by w1, which holds (or last held) the lease.
	states := []struct {
		state task.State
		name  string
		make  func(t *testing.T) uuid.UUID
	}{
		{task.Queued, "Queued", func(t *testing.T) uuid.UUID { return b.create(t, task.NewTask{}).ID }},
		{task.Retrying, "RetryingNotDue", func(t *testing.T) uuid.UUID {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			b.fail(t, "w1", task.Failure{ID: id, Error: "later", RetryAfter: time.Hour})
			return id
		}},
		{task.Running, "RunningLiveLease", func(t *testing.T) uuid.UUID {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Hour, id, task.Started)
			return id
		}},
		{task.Succeeded, "Succeeded", func(t *testing.T) uuid.UUID {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			if rs, err := b.store.Succeed(b.ctx, "w1", id); err != nil || !rs[0].Applied {
				t.Fatalf("Succeed = %+v, %v", rs, err)
			}
			return id
		}},
		{task.Dead, "Dead", func(t *testing.T) uuid.UUID {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			b.fail(t, "w1", task.Failure{ID: id, Error: "fatal", Permanent: true})
			return id
		}},
	}

	// guarded is an operation reporting a task.Result.
	type guarded func(id uuid.UUID) ([]task.Result, error)
	ops := []struct {
		name      string
		allowedIn task.State // the one state where the operation applies; "" for none
		do        guarded
	}{
		{"SucceedByOwner", task.Running, func(id uuid.UUID) ([]task.Result, error) { return b.store.Succeed(b.ctx, "w1", id) }},
		{"SucceedByIntruder", "", func(id uuid.UUID) ([]task.Result, error) { return b.store.Succeed(b.ctx, "intruder", id) }},
		{"FailByOwner", task.Running, func(id uuid.UUID) ([]task.Result, error) {
			return b.store.Fail(b.ctx, "w1", task.Failure{ID: id, Error: "x"})
		}},
		{"FailByIntruder", "", func(id uuid.UUID) ([]task.Result, error) {
			return b.store.Fail(b.ctx, "intruder", task.Failure{ID: id, Error: "x"})
		}},
		{"FailPermanentByIntruder", "", func(id uuid.UUID) ([]task.Result, error) {
			return b.store.Fail(b.ctx, "intruder", task.Failure{ID: id, Error: "x", Permanent: true})
		}},
		{"ReleaseByOwner", task.Running, func(id uuid.UUID) ([]task.Result, error) { return b.store.Release(b.ctx, "w1", id) }},
		{"ReleaseByIntruder", "", func(id uuid.UUID) ([]task.Result, error) { return b.store.Release(b.ctx, "intruder", id) }},
		{"Redrive", task.Dead, func(id uuid.UUID) ([]task.Result, error) { return b.store.Redrive(b.ctx, "operator", id) }},
	}

	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			for _, op := range ops {
				if op.allowedIn == st.state {
					continue
				}
				t.Run(op.name, func(t *testing.T) {
					t.Parallel()
					id := st.make(t)
					before := b.snapshot(t, id)
					tk := b.get(t, id)
					rs, err := op.do(id)
					if err != nil {
						t.Fatalf("refused transition returned an error: %v", err)
					}
					if len(rs) != 1 {
						t.Fatalf("%d results, want 1", len(rs))
					}
					r := rs[0]
					if r.Applied || r.ID != id || r.Status != st.state || r.AttemptCount != tk.AttemptCount || r.LeaseOwner != tk.LeaseOwner {
						t.Fatalf("result = %+v, want not applied and the current state %s (attempts %d, owner %q)", r, st.state, tk.AttemptCount, tk.LeaseOwner)
					}
					if after := b.snapshot(t, id); after != before {
						t.Fatalf("a refused transition changed something:\nbefore %+v\nafter  %+v", before, after)
					}
				})
			}
			if st.state == task.Queued {
				return // starting a queued task is allowed
			}
			t.Run("StartByOther", func(t *testing.T) {
				t.Parallel()
				id := st.make(t)
				before := b.snapshot(t, id)
				want := task.Finished
				switch st.state {
				case task.Retrying:
					want = task.NotDue
				case task.Running:
					want = task.LeaseHeld
				}
				r := b.start(t, "w2", time.Minute, id, want)
				if r.Task == nil || r.Task.Status != st.state || r.Task.Payload != nil {
					t.Fatalf("start result = %+v, task %+v; want the unchanged %s task without payload", r, r.Task, st.state)
				}
				if after := b.snapshot(t, id); after != before {
					t.Fatalf("a refused start changed something:\nbefore %+v\nafter  %+v", before, after)
				}
			})
			t.Run("RenewByOwner", func(t *testing.T) {
				t.Parallel()
				id := st.make(t)
				before := b.snapshot(t, id)
				renewed, _, err := b.store.Renew(b.ctx, "w1", time.Hour, id)
				if st.state == task.Running {
					if err != nil || len(renewed) != 1 {
						t.Fatalf("Renew by the owner = %v, %v; want the id", renewed, err)
					}
					return
				}
				if err != nil || len(renewed) != 0 {
					t.Fatalf("Renew of a %s task = %v, %v; want nothing renewed", st.state, renewed, err)
				}
				if after := b.snapshot(t, id); after != before {
					t.Fatalf("a refused renewal changed something:\nbefore %+v\nafter  %+v", before, after)
				}
			})
			t.Run("RenewByIntruder", func(t *testing.T) {
				t.Parallel()
				id := st.make(t)
				before := b.snapshot(t, id)
				renewed, _, err := b.store.Renew(b.ctx, "intruder", time.Hour, id)
				if err != nil || len(renewed) != 0 {
					t.Fatalf("Renew by an intruder = %v, %v; want nothing renewed", renewed, err)
				}
				if after := b.snapshot(t, id); after != before {
					t.Fatalf("a refused renewal changed something:\nbefore %+v\nafter  %+v", before, after)
				}
			})
		})
	}

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		id := uuid.New()
		if r := b.start(t, "w1", time.Minute, id, task.NotFound); r.Task != nil || r.ID != id {
			t.Fatalf("start of an unknown id = %+v, want NotFound without a task", r)
		}
		for _, op := range ops {
			rs, err := op.do(id)
			if err != nil || len(rs) != 1 || rs[0].Applied || rs[0].Status != "" || rs[0].ID != id {
				t.Fatalf("%s of an unknown id = %+v, %v; want not applied with no status", op.name, rs, err)
			}
		}
		if renewed, _, err := b.store.Renew(b.ctx, "w1", time.Minute, id); err != nil || len(renewed) != 0 {
			t.Fatalf("Renew of an unknown id = %v, %v", renewed, err)
		}
		if _, err := b.store.Get(b.ctx, id); err == nil || !strings.Contains(err.Error(), id.String()) {
			t.Fatalf("Get of an unknown id = %v, want ErrNotFound naming it", err)
		}
	})
}

// TestRenew checks that the owner's renewal moves lease_until and writes no
// audit row.
func TestRenew(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	ids := []uuid.UUID{b.create(t, task.NewTask{}).ID, b.create(t, task.NewTask{}).ID}
	rs, err := b.store.Start(b.ctx, "w1", time.Second, ids...)
	if err != nil || rs[0].Outcome != task.Started || rs[1].Outcome != task.Started {
		t.Fatalf("Start = %+v, %v", rs, err)
	}
	renewed, _, err := b.store.Renew(b.ctx, "w1", time.Hour, ids[0], ids[1], ids[0])
	if err != nil || len(renewed) != 2 {
		t.Fatalf("Renew = %v, %v; want both ids once", renewed, err)
	}
	for _, id := range ids {
		tk := b.get(t, id)
		if tk.LeaseUntil.Sub(tk.UpdatedAt) != time.Hour {
			t.Fatalf("lease_until - updated_at = %s after renewing for 1h", tk.LeaseUntil.Sub(tk.UpdatedAt))
		}
		if n := len(b.transitions(t, id)); n != 2 {
			t.Fatalf("%d transitions, want 2: a renewal is no state change", n)
		}
	}
}
