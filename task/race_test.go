package task_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// race runs f(i) for i in [0, n) in n goroutines released at the same moment
// and waits for all of them.
func race(n int, f func(i int)) {
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			f(i)
		}()
	}
	close(gate)
	wg.Wait()
}

func TestStartRace(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	id := b.create(t, task.NewTask{}).ID

	const n = 50
	results := make([]task.StartResult, n)
	errs := make([]error, n)
	race(n, func(i int) {
		var rs []task.StartResult
		rs, errs[i] = b.store.Start(b.ctx, fmt.Sprintf("w%d", i), time.Minute, id)
		if len(rs) == 1 {
			results[i] = rs[0]
		}
	})
	winner := -1
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("Start %d: %v", i, errs[i])
		}
		switch r.Outcome {
		case task.Started:
			if winner >= 0 {
				t.Fatalf("both w%d and w%d started the task", winner, i)
			}
			winner = i
		case task.LeaseHeld:
			if r.Task == nil || r.Task.Status != task.Running {
				t.Fatalf("loser w%d: %+v, want LEASE_HELD seeing RUNNING", i, r)
			}
		default:
			t.Fatalf("Start w%d = %s, want STARTED or LEASE_HELD", i, r.Outcome)
		}
	}
	if winner < 0 {
		t.Fatal("no Start won")
	}
	tk := b.get(t, id)
	if tk.Status != task.Running || tk.LeaseOwner != fmt.Sprintf("w%d", winner) || tk.AttemptCount != 0 {
		t.Fatalf("task = %+v, want RUNNING under the winner w%d", tk, winner)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task_transition WHERE task_id = $1 AND from_status = 'QUEUED' AND to_status = 'RUNNING'`, id); n != 1 {
		t.Fatalf("%d QUEUED -> RUNNING transitions, want exactly 1", n)
	}
	if n := len(b.transitions(t, id)); n != 2 {
		t.Fatalf("%d transitions, want 2 (created, started)", n)
	}
}

// TestStartBatchRace races whole batches given in different orders: every
// task starts exactly once and the row locks (taken in id order) never
// deadlock into an error.
func TestStartBatchRace(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	ids := make([]uuid.UUID, 12)
	for i := range ids {
		ids[i] = b.create(t, task.NewTask{}).ID
	}
	const n = 10
	started := make([]map[uuid.UUID]bool, n)
	errs := make([]error, n)
	race(n, func(i int) {
		order := append([]uuid.UUID(nil), ids...)
		rand.Shuffle(len(order), func(a, c int) { order[a], order[c] = order[c], order[a] })
		rs, err := b.store.Start(b.ctx, fmt.Sprintf("w%d", i), time.Minute, order...)
		errs[i] = err
		started[i] = map[uuid.UUID]bool{}
		for k, r := range rs {
			if r.ID != order[k] {
				errs[i] = fmt.Errorf("result %d is for %s, want %s: results not in the order given", k, r.ID, order[k])
			}
			if r.Outcome == task.Started {
				started[i][r.ID] = true
			}
		}
	})
	for _, id := range ids {
		winners := 0
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("Start batch %d: %v", i, errs[i])
			}
			if started[i][id] {
				winners++
			}
		}
		if winners != 1 {
			t.Fatalf("task %s started %d times, want 1", id, winners)
		}
	}
}

func TestFailRace(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(3))

	// Both racers hold the same owner string, so either could win; only the
	// conditional UPDATE decides. The second racer is Fail or Succeed.
	for _, other := range []string{"Fail", "Succeed"} {
		t.Run("FailVersus"+other, func(t *testing.T) {
			t.Parallel()
			const tasks = 8
			ids := make([]uuid.UUID, tasks)
			for k := range ids {
				ids[k] = b.create(t, task.NewTask{}).ID
				b.failTimes(t, ids[k], 2) // attempt_count = max_attempts - 1
				b.startWhenDue(t, "w", time.Minute, ids[k])
			}
			// All 2*tasks racers are released at once.
			results := make([]task.Result, 2*tasks)
			errs := make([]error, 2*tasks)
			race(2*tasks, func(i int) {
				id := ids[i/2]
				var rs []task.Result
				if i%2 == 1 && other == "Succeed" {
					rs, errs[i] = b.store.Succeed(b.ctx, "w", id)
				} else {
					rs, errs[i] = b.store.Fail(b.ctx, "w", task.Failure{ID: id, Error: fmt.Sprintf("racer %d", i)})
				}
				if len(rs) == 1 {
					results[i] = rs[0]
				}
			})
			for k, id := range ids {
				checkFailRace(t, b, id, other, results[2*k:2*k+2], errs[2*k:2*k+2])
			}
		})
	}
}

func checkFailRace(t *testing.T, b *bundle, id uuid.UUID, other string, results []task.Result, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("racer %d: %v", i, err)
		}
	}
	if results[0].Applied == results[1].Applied {
		t.Fatalf("task %s: applied = %v and %v, want exactly one", id, results[0].Applied, results[1].Applied)
	}
	tk := b.get(t, id)
	want, attempts := task.Dead, 3
	if other == "Succeed" && results[1].Applied {
		want, attempts = task.Succeeded, 2
	}
	if max := tk.EffectiveMaxAttempts(b.store.Config().MaxAttempts); tk.Status != want || tk.AttemptCount != attempts || tk.AttemptCount > max {
		t.Errorf("task %s is %s with %d of %d attempts, want %s with %d", id, tk.Status, tk.AttemptCount, max, want, attempts)
	}
	for i, r := range results {
		if r.Status != want || r.AttemptCount != attempts {
			t.Errorf("racer %d result %+v, want the final %s with %d attempts", i, r, want, attempts)
		}
	}
	var n int
	if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM ingest_task_transition WHERE task_id = $1 AND from_status = 'RUNNING'
		AND to_status IN ('DEAD', 'SUCCEEDED')`, id).Scan(&n); err != nil || n != 1 {
		t.Errorf("task %s: %d final transitions (%v), want 1", id, n, err)
	}
}

func TestTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(3))

	t.Run("ExpiredLeaseCountsAnAttempt", func(t *testing.T) {
		t.Parallel()
		id := b.create(t, task.NewTask{}).ID
		b.start(t, "w1", time.Second, id, task.Started)
		// Under w1's live lease another worker is skipped...
		b.start(t, "w2", time.Minute, id, task.LeaseHeld)
		// ...and takes over once lease_until has passed.
		r := b.startWhenDue(t, "w2", time.Minute, id)
		if r.Outcome != task.TakenOver {
			t.Fatalf("takeover = %+v, want TAKEN_OVER", r)
		}
		if r.Task.AttemptCount != 1 || r.Task.LeaseOwner != "w2" || !strings.Contains(r.Task.LastError, "lease of w1 expired") {
			t.Fatalf("task after takeover = %+v, want 1 attempt counted, w2's lease, w1's abandoned run as last_error", r.Task)
		}
		if string(r.Task.Payload) == "" {
			t.Fatal("takeover returned no payload for the new run")
		}
		lostLease(t, b, id, "w1", task.Running)
		if rs, err := b.store.Succeed(b.ctx, "w2", id); err != nil || !rs[0].Applied {
			t.Fatalf("Succeed by the new owner = %+v, %v", rs, err)
		}
		assertPath(t, b, id, "", "QUEUED", "RUNNING", "RUNNING", "SUCCEEDED")
	})

	t.Run("LastAttemptDies", func(t *testing.T) {
		t.Parallel()
		id := b.create(t, task.NewTask{}).ID
		b.failTimes(t, id, 2)
		b.startWhenDue(t, "w1", 50*time.Millisecond, id)
		r := b.startWhenDue(t, "w2", time.Minute, id)
		if r.Outcome != task.DiedOnTakeover {
			t.Fatalf("takeover at the last attempt = %+v, want DIED_ON_TAKEOVER", r)
		}
		if r.Task.Status != task.Dead || r.Task.AttemptCount != 3 || r.Task.FinishedAt == nil || r.Task.LeaseOwner != "" {
			t.Fatalf("task = %+v, want DEAD with 3 of 3 attempts, finished, no lease", r.Task)
		}
		lostLease(t, b, id, "w1", task.Dead)
		lostLease(t, b, id, "w2", task.Dead)
		rec := b.lastTransition(t, id)
		if rec.From != "RUNNING" || rec.To != "DEAD" || rec.Worker != "w2" || rec.AttemptCount != 3 {
			t.Fatalf("last transition = %+v, want RUNNING -> DEAD by w2 at attempt 3", rec)
		}
	})

	t.Run("TakenOverTwice", func(t *testing.T) {
		t.Parallel()
		id := b.create(t, task.NewTask{}).ID
		b.start(t, "w1", time.Minute, id, task.Started)
		b.expireLease(t, id)
		b.start(t, "w2", time.Minute, id, task.TakenOver)
		b.expireLease(t, id)
		r := b.start(t, "w3", time.Minute, id, task.TakenOver)
		if r.Task.AttemptCount != 2 {
			t.Fatalf("second takeover = %+v, want TAKEN_OVER at attempt 2", r)
		}
		lostLease(t, b, id, "w1", task.Running)
		lostLease(t, b, id, "w2", task.Running)
		assertPath(t, b, id, "", "QUEUED", "RUNNING", "RUNNING", "RUNNING")
	})
}

// lostLease checks that owner, whose lease was taken over, can neither
// finish, fail, release nor renew the task, and that trying changes nothing.
func lostLease(t *testing.T, b *bundle, id uuid.UUID, owner string, state task.State) {
	t.Helper()
	before := b.snapshot(t, id)
	s, err := b.store.Succeed(b.ctx, owner, id)
	if err != nil || s[0].Applied || s[0].Status != state {
		t.Fatalf("Succeed by %s after losing the lease = %+v, %v; want not applied, still %s", owner, s, err, state)
	}
	f, err := b.store.Fail(b.ctx, owner, task.Failure{ID: id, Error: "late"})
	if err != nil || f[0].Applied || f[0].Status != state {
		t.Fatalf("Fail by %s after losing the lease = %+v, %v; want not applied, still %s", owner, f, err, state)
	}
	r, err := b.store.Release(b.ctx, owner, id)
	if err != nil || r[0].Applied {
		t.Fatalf("Release by %s after losing the lease = %+v, %v", owner, r, err)
	}
	if renewed, _, err := b.store.Renew(b.ctx, owner, time.Hour, id); err != nil || len(renewed) != 0 {
		t.Fatalf("Renew by %s after losing the lease = %v, %v", owner, renewed, err)
	}
	if after := b.snapshot(t, id); after != before {
		t.Fatalf("the former owner %s changed the task:\nbefore %+v\nafter  %+v", owner, before, after)
	}
}

// assertPath checks the task's audit trail: from-states then the to-state of
// each transition, e.g. "", "QUEUED", "RUNNING" for created then started.
func assertPath(t *testing.T, b *bundle, id uuid.UUID, path ...string) {
	t.Helper()
	recs := b.transitions(t, id)
	var got []string
	for i, r := range recs {
		if i == 0 {
			got = append(got, r.From)
		}
		got = append(got, r.To)
	}
	if strings.Join(got, ",") != strings.Join(path, ",") {
		t.Fatalf("audit path = %q, want %q", got, path)
	}
}

func TestRetryDue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		backoff task.Backoff
		failure task.Failure
	}{
		{"RetryAfter", task.DefaultBackoff, task.Failure{Error: "429", RetryAfter: time.Second}},
		{"Backoff", task.Backoff{Base: time.Second, Max: time.Minute}, task.Failure{Error: "503"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, task.Config{Backoff: tt.backoff})
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w1", time.Minute, id, task.Started)
			f := tt.failure
			f.ID = id
			r := b.fail(t, "w1", f)
			if r.Status != task.Retrying || r.NextRetryAt == nil {
				t.Fatalf("Fail = %+v, want RETRYING with next_retry_at", r)
			}
			tk := b.get(t, id)
			if d := tk.NextRetryAt.Sub(tk.UpdatedAt); d != time.Second {
				t.Fatalf("next_retry_at is %s after the failure, want 1s", d)
			}
			before := b.snapshot(t, id)
			nd := b.start(t, "w2", time.Minute, id, task.NotDue)
			if nd.Task == nil || nd.Task.Status != task.Retrying || nd.Task.NextRetryAt == nil {
				t.Fatalf("NotDue result = %+v, want the RETRYING task with its due time", nd)
			}
			if after := b.snapshot(t, id); after != before {
				t.Fatalf("a NOT_DUE start changed the task:\nbefore %+v\nafter  %+v", before, after)
			}
			s := b.startWhenDue(t, "w2", time.Minute, id)
			if s.Outcome != task.Started || s.Task.AttemptCount != 1 {
				t.Fatalf("start when due = %+v, want STARTED at attempt 1", s)
			}
			// The start's transaction began no earlier than the due time.
			rec := b.lastTransition(t, id)
			if rec.To != "RUNNING" || rec.CreatedAt.Before(*tk.NextRetryAt) {
				t.Fatalf("started at %v (%+v), before the due time %v", rec.CreatedAt, rec, *tk.NextRetryAt)
			}
		})
	}
}

// TestFailBackoffInSQL checks that the delay the SQL computes in Fail lies in
// Backoff.Bounds for the attempt, including the cap and sub-millisecond
// policies.
func TestFailBackoffInSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{MaxAttempts: 100})
	policies := []struct {
		name string
		b    task.Backoff
	}{
		{"Jittered", task.Backoff{Base: time.Second, Max: 30 * time.Second, Jitter: 0.2}},
		{"Exact", task.Backoff{Base: 1500 * time.Microsecond, Max: 20 * time.Millisecond}},
		{"Default", task.DefaultBackoff},
		{"AtOnce", task.Backoff{Jitter: 0.1}},
	}
	for _, p := range policies {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			s, err := task.NewStore(task.Config{MaxAttempts: 100, Backoff: p.b}, b.db)
			if err != nil {
				t.Fatal(err)
			}
			for _, attempt := range []int{1, 2, 3, 4, 6, 12, 70} {
				for sample := 0; sample < 2; sample++ {
					id := b.create(t, task.NewTask{}).ID
					// Fixture: the task has failed attempt-1 times already.
					if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET attempt_count = $2 WHERE id = $1`, id, attempt-1); err != nil {
						t.Fatal(err)
					}
					b.start(t, "w", time.Minute, id, task.Started)
					rs, err := s.Fail(b.ctx, "w", task.Failure{ID: id, Error: "x"})
					if err != nil || !rs[0].Applied || rs[0].AttemptCount != attempt {
						t.Fatalf("Fail = %+v, %v; want applied at attempt %d", rs, err, attempt)
					}
					tk := b.get(t, id)
					// next_retry_at and updated_at are both computed from the
					// transaction's now().
					d := tk.NextRetryAt.Sub(tk.UpdatedAt)
					lo, hi := p.b.Bounds(attempt)
					if d < lo-time.Microsecond || d > hi+time.Microsecond {
						t.Fatalf("attempt %d: SQL backoff %s outside Bounds [%s, %s]", attempt, d, lo, hi)
					}
				}
			}
		})
	}
	t.Run("RetryAfterReplacesBackoff", func(t *testing.T) {
		t.Parallel()
		for _, after := range []time.Duration{2500 * time.Microsecond, 90 * time.Second} {
			id := b.create(t, task.NewTask{}).ID
			b.start(t, "w", time.Minute, id, task.Started)
			b.fail(t, "w", task.Failure{ID: id, Error: "x", RetryAfter: after})
			tk := b.get(t, id)
			if d := tk.NextRetryAt.Sub(tk.UpdatedAt); d != after {
				t.Fatalf("RetryAfter %s: next_retry_at is %s after the failure", after, d)
			}
		}
	})
}
