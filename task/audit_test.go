package task_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestAuditTrailProperty runs random operations from several goroutines on
// a few tasks and checks, for every task, that its audit trail is a valid
// path through the state machine that ends in the task's current state, and
// that it has exactly one row per applied transition the callers observed.
func TestAuditTrailProperty(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	b := setup(t, task.Config{MaxAttempts: 4, Backoff: task.Backoff{Base: time.Millisecond, Max: 4 * time.Millisecond, Jitter: 0.5}})

	const tasks, workers, steps, rounds = 8, 4, 100, 10
	// What a run must reach to have exercised the state machine.
	const minTransitions, minKinds = 60, 5
	var ids []uuid.UUID
	var mu sync.Mutex
	applied := map[uuid.UUID]int{} // transitions observed per task
	ops := map[string]int{}        // applied transitions per operation, for the log
	observe := func(op string, id uuid.UUID) {
		mu.Lock()
		defer mu.Unlock()
		applied[id]++
		ops[op]++
	}
	countResults := func(op string, rs []task.Result) {
		for _, r := range rs {
			if r.Applied {
				observe(op, r.ID)
			}
		}
	}

	// The run must exercise the machine, or the property says little
	// (checked at the end). SUCCEEDED is terminal, so a round whose tasks
	// all succeed early stops moving: rounds of steps, each with a fresh
	// batch of tasks beside the earlier ones, go on until enough
	// transitions of enough kinds were applied.
	exercised := func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := len(ids) // the creations
		for _, c := range ops {
			n += c
		}
		return n >= minTransitions && len(ops) >= minKinds
	}
	for round := 0; round < rounds && !exercised(); round++ {
		for range tasks {
			id := b.create(t, task.NewTask{}).ID
			ids = append(ids, id)
			applied[id] = 1 // creation
		}
		race(workers, func(w int) {
			rng := rand.New(rand.NewPCG(seed, uint64(round*workers+w)))
			for step := 0; step < steps; step++ {
				// One to three distinct tasks, in random order.
				perm := rng.Perm(len(ids))[:1+rng.IntN(3)]
				pick := make([]uuid.UUID, len(perm))
				for i, p := range perm {
					pick[i] = ids[p]
				}
				owner := fmt.Sprintf("w%d", rng.IntN(2))
				var err error
				// Weights keep tasks moving: SUCCEEDED is terminal, so succeed is
				// rare; DEAD and CANCELLED come back through redrive.
				switch op := pickOp(rng); op {
				case "start", "takeover":
					if op == "takeover" {
						for _, id := range pick { // one row per statement: no lock-order deadlock with batches
							if _, err = b.db.Exec(b.ctx, `UPDATE ingest_task SET lease_until = now() - interval '1 ms'
								WHERE id = $1 AND status = 'RUNNING'`, id); err != nil {
								break
							}
						}
					}
					var rs []task.StartResult
					if err == nil {
						rs, err = b.store.Start(b.ctx, owner, time.Hour, pick...)
					}
					for _, r := range rs {
						switch {
						case r.Outcome == task.DiedOnTakeover:
							observe("takeover-dead", r.ID)
						case r.Outcome == task.TakenOver || r.Outcome == task.CancelledOnTakeover:
							observe("takeover", r.ID)
						case r.Outcome == task.Started:
							observe("start", r.ID)
						}
					}
				case "succeed":
					var rs []task.Result
					rs, err = b.store.Succeed(b.ctx, owner, pick...)
					countResults("succeed", rs)
				case "fail":
					fails := make([]task.Failure, len(pick))
					for i, id := range pick {
						fails[i] = task.Failure{ID: id, Error: fmt.Sprintf("step %d", step), Permanent: rng.IntN(6) == 0}
						if rng.IntN(2) == 0 {
							fails[i].RetryAfter = time.Duration(rng.IntN(3)) * time.Millisecond
						}
					}
					var rs []task.Result
					rs, err = b.store.Fail(b.ctx, owner, fails...)
					countResults("fail", rs)
				case "release":
					var rs []task.Result
					rs, err = b.store.Release(b.ctx, owner, pick...)
					countResults("release", rs)
				case "redrive":
					var rs []task.Result
					rs, err = b.store.Redrive(b.ctx, "operator", pick...)
					countResults("redrive", rs)
				case "renew":
					_, _, err = b.store.Renew(b.ctx, owner, time.Hour, pick...)
				case "cancel":
					var r task.CancelResult
					r, err = b.store.Cancel(b.ctx, "operator", fmt.Sprintf("step %d", step), pick[0])
					if r.Outcome == task.CancelDone {
						observe("cancel", pick[0])
					}
				}
				if err != nil {
					t.Errorf("worker %d step %d: %v", w, step, err)
					return
				}
			}
		})
		if t.Failed() {
			return
		}
	}
	t.Logf("applied transitions by operation: %v", ops)

	total := 0
	for _, id := range ids {
		tk := b.get(t, id)
		recs := b.transitions(t, id)
		total += len(recs)
		if len(recs) != applied[id] {
			t.Errorf("task %s: %d audit rows, but callers saw %d applied transitions", id, len(recs), applied[id])
		}
		var path []string
		for i, r := range recs {
			path = append(path, r.From+"->"+r.To)
			if i == 0 {
				if r.From != "" || r.To != string(task.Queued) || r.AttemptCount != 0 {
					t.Errorf("task %s: first transition %+v, want creation", id, r)
				}
				continue
			}
			prev := recs[i-1]
			if r.From != prev.To {
				t.Errorf("task %s: transition %d starts at %s, but the previous one ended at %s", id, i, r.From, prev.To)
			}
			if !task.CanTransition(task.State(r.From), task.State(r.To)) {
				t.Errorf("task %s: transition %d %s -> %s is not allowed", id, i, r.From, r.To)
			}
			if max := tk.EffectiveMaxAttempts(b.store.Config().MaxAttempts); r.AttemptCount < 0 || r.AttemptCount > max {
				t.Errorf("task %s: transition %d has attempt_count %d of %d", id, i, r.AttemptCount, max)
			}
			// Attempts grow by at most one per transition; only a redrive
			// (from DEAD or CANCELLED) resets them.
			if r.To == string(task.Queued) {
				if r.AttemptCount != 0 {
					t.Errorf("task %s: redrive %d kept attempt_count %d", id, i, r.AttemptCount)
				}
			} else if d := r.AttemptCount - prev.AttemptCount; d < 0 || d > 1 {
				t.Errorf("task %s: transition %d %s -> %s moved attempt_count from %d to %d", id, i, r.From, r.To, prev.AttemptCount, r.AttemptCount)
			}
			if !utf8.ValidString(r.Message) || !utf8.ValidString(r.Worker) {
				t.Errorf("task %s: transition %d has invalid UTF-8", id, i)
			}
		}
		last := recs[len(recs)-1]
		if task.State(last.To) != tk.Status || last.AttemptCount != tk.AttemptCount {
			t.Errorf("task %s is %s at attempt %d, but its last transition is %+v", id, tk.Status, tk.AttemptCount, last)
		}
		if t.Failed() {
			t.Logf("task %s path: %s", id, strings.Join(path, " "))
		}
	}
	// The run must have exercised the machine, or the property says little.
	var kinds []string
	for op := range ops {
		kinds = append(kinds, op)
	}
	sort.Strings(kinds)
	if total < minTransitions || len(kinds) < minKinds {
		t.Fatalf("only %d transitions of kinds %v: the random run did not exercise the state machine", total, kinds)
	}
}

// pickOp chooses an operation of the property test by weight.
func pickOp(rng *rand.Rand) string {
	weights := []struct {
		op string
		w  int
	}{{"start", 28}, {"takeover", 10}, {"succeed", 4}, {"fail", 25}, {"release", 10}, {"redrive", 15}, {"renew", 4}, {"cancel", 4}}
	n := rng.IntN(100)
	for _, x := range weights {
		if n < x.w {
			return x.op
		}
		n -= x.w
	}
	panic("weights do not add up to 100")
}

// TestLatencyFromDue: the latency AuditSamples reports for a success runs
// from when the task's life became due, not from its creation: a delayed
// task's run_at, a run-now, a redrive. A task due at its creation (due_at
// NULL) is measured from created_at. Each case is a kind of its own; its
// created_at is set an hour back, so that a latency measured from the
// creation would be at least an hour.
func TestLatencyFromDue(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := b.db.Exec(b.ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	backdate := func(id uuid.UUID) {
		t.Helper()
		exec(`UPDATE ingest_task SET created_at = created_at - interval '1 hour' WHERE id = $1`, id)
	}
	succeed := func(id uuid.UUID) {
		t.Helper()
		b.start(t, "w1", time.Minute, id, task.Started)
		if rs, err := b.store.Succeed(b.ctx, "w1", id); err != nil || len(rs) != 1 || !rs[0].Applied {
			t.Fatalf("Succeed = %+v, %v", rs, err)
		}
	}
	dueAt := func(id uuid.UUID) (due, next *time.Time) {
		t.Helper()
		if err := b.db.QueryRow(b.ctx, `SELECT due_at, next_retry_at FROM ingest_task WHERE id = $1`, id).Scan(&due, &next); err != nil {
			t.Fatal(err)
		}
		return due, next
	}

	plain := b.create(t, task.NewTask{Kind: "lat.created"}).ID
	if due, _ := dueAt(plain); due != nil {
		t.Fatalf("a task due at its creation has due_at %v, want NULL", due)
	}
	backdate(plain)
	succeed(plain)

	// Delayed: due_at is its first due time; the hour it waited is
	// moved back, as if it had been created an hour before its due time,
	// which passed ten seconds ago.
	delayed := b.create(t, task.NewTask{Kind: "lat.delayed", Delay: time.Hour}).ID
	if due, next := dueAt(delayed); due == nil || next == nil || !due.Equal(*next) {
		t.Fatalf("a delayed task has due_at %v, next_retry_at %v; want both its due time", due, next)
	}
	exec(`UPDATE ingest_task SET created_at = now() - interval '1 hour 10 seconds',
	      due_at = now() - interval '10 seconds', next_retry_at = now() - interval '10 seconds' WHERE id = $1`, delayed)
	succeed(delayed)

	runNow := b.create(t, task.NewTask{Kind: "lat.runnow", Delay: time.Hour}).ID
	backdate(runNow)
	if r, err := b.store.RunNow(b.ctx, "cli:test", runNow); err != nil || r.Outcome != task.RunNowDone {
		t.Fatalf("RunNow = %+v, %v", r, err)
	}
	succeed(runNow)

	redriven := b.create(t, task.NewTask{Kind: "lat.redrive"}).ID
	backdate(redriven)
	b.start(t, "w1", time.Minute, redriven, task.Started)
	b.fail(t, "w1", task.Failure{ID: redriven, Error: "boom", Permanent: true})
	if rs, err := b.store.Redrive(b.ctx, "cli:test", redriven); err != nil || len(rs) != 1 || !rs[0].Applied {
		t.Fatalf("Redrive = %+v, %v", rs, err)
	}
	succeed(redriven)

	samples, err := task.AuditSamples(b.ctx, b.db, 0, time.Now().Add(-2*time.Hour), 1000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lat := map[string]float64{}
	for _, s := range samples {
		if s.To == task.Succeeded {
			lat[s.Kind] = max(lat[s.Kind], s.LatMax)
		}
	}
	if got := lat["lat.created"]; got < 3600 {
		t.Errorf("a task due at its creation an hour ago: latency %.1fs, want at least 3600s (from its creation)", got)
	}
	for _, kind := range []string{"lat.delayed", "lat.runnow", "lat.redrive"} {
		// Ten seconds of waiting, plus the test's own time on a loaded
		// machine: far below the hour since the creation.
		if got, ok := lat[kind]; !ok || got > 1800 {
			t.Errorf("%s: latency %.1fs (reported %v), want it measured from its due time (well under an hour)", kind, got, ok)
		}
	}
}
