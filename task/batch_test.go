package task_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// mixedSet creates one task in each situation a batch may meet and returns
// their ids by name ("missing" is an id of no task).
func (b *bundle) mixedSet(t *testing.T) map[string]uuid.UUID {
	t.Helper()
	ids := map[string]uuid.UUID{}
	mk := func(name string, maxAttempts int) uuid.UUID {
		ids[name] = b.create(t, task.NewTask{MaxAttempts: maxAttempts}).ID
		return ids[name]
	}
	mk("queued", 3)

	id := mk("succeeded", 3)
	b.start(t, "other", time.Minute, id, task.Started)
	if _, err := b.store.Succeed(b.ctx, "other", id); err != nil {
		t.Fatal(err)
	}

	id = mk("dead", 1)
	b.start(t, "other", time.Minute, id, task.Started)
	b.fail(t, "other", task.Failure{ID: id, Error: "boom"})

	id = mk("not_due", 3)
	b.start(t, "other", time.Minute, id, task.Started)
	b.fail(t, "other", task.Failure{ID: id, Error: "boom", RetryAfter: time.Hour})

	id = mk("due_retry", 3)
	b.start(t, "other", time.Minute, id, task.Started)
	b.fail(t, "other", task.Failure{ID: id, Error: "boom", RetryAfter: time.Microsecond})

	id = mk("other_live_lease", 3)
	b.start(t, "other", time.Hour, id, task.Started)

	id = mk("expired_lease", 3)
	b.start(t, "other", time.Hour, id, task.Started)
	b.expireLease(t, id)

	id = mk("expired_last_attempt", 1)
	b.start(t, "other", time.Hour, id, task.Started)
	b.expireLease(t, id)

	id = mk("mine_running", 3)
	b.start(t, "me", time.Hour, id, task.Started)

	ids["missing"] = uuid.New()
	return ids
}

// observed is what one call did to one task, compared between the batch
// and the single-task path.
type observed struct {
	outcome           task.StartOutcome
	applied           bool
	status            task.State
	attempts          int
	transitions       int
	lastFrom, lastTo  string
	lastMsg, lastWork string
	leaseOwner        string
}

func (b *bundle) observe(t *testing.T, id uuid.UUID) observed {
	t.Helper()
	var o observed
	tk, err := b.store.Get(b.ctx, id)
	if err != nil {
		return o // missing
	}
	recs := b.transitions(t, id)
	last := recs[len(recs)-1]
	o.status, o.attempts, o.leaseOwner = tk.Status, tk.AttemptCount, tk.LeaseOwner
	o.transitions, o.lastFrom, o.lastTo, o.lastMsg, o.lastWork = len(recs), last.From, last.To, last.Message, last.Worker
	return o
}

// TestBatchMatchesSingleTaskPath: Start, Succeed and Fail called with one
// batch holding tasks in every situation (queued, terminal, not due, due
// retry, under another live lease, expired leases, running here, missing)
// treat each exactly as a call with that task alone does: same outcome,
// same row afterwards, same audit rows.
func TestBatchMatchesSingleTaskPath(t *testing.T) {
	t.Parallel()
	type op struct {
		name string
		run  func(b *bundle, t *testing.T, ids []uuid.UUID) map[uuid.UUID]observed
	}
	ops := []op{
		{"Start", func(b *bundle, t *testing.T, ids []uuid.UUID) map[uuid.UUID]observed {
			rs, err := b.store.Start(b.ctx, "me", time.Minute, ids...)
			if err != nil {
				t.Fatal(err)
			}
			out := map[uuid.UUID]observed{}
			for _, r := range rs {
				o := b.observe(t, r.ID)
				o.outcome = r.Outcome
				out[r.ID] = o
			}
			return out
		}},
		{"Succeed", func(b *bundle, t *testing.T, ids []uuid.UUID) map[uuid.UUID]observed {
			rs, err := b.store.Succeed(b.ctx, "me", ids...)
			if err != nil {
				t.Fatal(err)
			}
			out := map[uuid.UUID]observed{}
			for _, r := range rs {
				o := b.observe(t, r.ID)
				o.applied = r.Applied
				if r.Status != o.status {
					t.Errorf("Succeed result status %s, row %s", r.Status, o.status)
				}
				out[r.ID] = o
			}
			return out
		}},
		{"Fail", func(b *bundle, t *testing.T, ids []uuid.UUID) map[uuid.UUID]observed {
			var fs []task.Failure
			for _, id := range ids {
				fs = append(fs, task.Failure{ID: id, Error: "batch boom", RetryAfter: time.Hour})
			}
			rs, err := b.store.Fail(b.ctx, "me", fs...)
			if err != nil {
				t.Fatal(err)
			}
			out := map[uuid.UUID]observed{}
			for _, r := range rs {
				o := b.observe(t, r.ID)
				o.applied = r.Applied
				out[r.ID] = o
			}
			return out
		}},
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, task.Config{})
			batchSet, singleSet := b.mixedSet(t), b.mixedSet(t)
			names := make([]string, 0, len(batchSet))
			ids := make([]uuid.UUID, 0, len(batchSet))
			for name, id := range batchSet {
				names = append(names, name)
				ids = append(ids, id)
			}
			// A duplicate in the batch is treated as one.
			ids = append(ids, batchSet["queued"])
			got := op.run(b, t, ids)
			if op.name == "Start" {
				for name, want := range map[string]task.StartOutcome{
					"queued": task.Started, "succeeded": task.Finished, "dead": task.Finished, "not_due": task.NotDue,
					"due_retry": task.Started, "other_live_lease": task.LeaseHeld, "expired_lease": task.TakenOver,
					"expired_last_attempt": task.DiedOnTakeover, "mine_running": task.LeaseHeld, "missing": task.NotFound,
				} {
					if g := got[batchSet[name]].outcome; g != want {
						t.Errorf("%s: outcome %s, want %s", name, g, want)
					}
				}
				if o := got[batchSet["expired_last_attempt"]]; o.outcome != task.DiedOnTakeover || o.status != task.Dead {
					t.Errorf("expired_last_attempt: %+v, want died, DEAD", o)
				}
			}
			if op.name == "Succeed" {
				for name, id := range batchSet {
					if got[id].applied != (name == "mine_running") {
						t.Errorf("%s: applied %v; only mine_running may be", name, got[id].applied)
					}
				}
			}
			for _, name := range names {
				want := op.run(b, t, []uuid.UUID{singleSet[name]})[singleSet[name]]
				if g := got[batchSet[name]]; g != want {
					t.Errorf("%s: in a batch %+v, alone %+v", name, g, want)
				}
			}
		})
	}
}
