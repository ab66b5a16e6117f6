package task_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// bundle is what most tests need: a fresh migrated database and a store on it.
type bundle struct {
	ctx   context.Context
	db    *pgxpool.Pool
	store *task.Store
}

// setup returns a bundle on a database of this test only. cfg is passed to
// task.NewStore (zero fields take the defaults).
func setup(t *testing.T, cfg task.Config) *bundle {
	t.Helper()
	db := testenv.DB(t)
	s, err := task.NewStore(cfg, db)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return &bundle{ctx: context.Background(), db: db, store: s}
}

// fastRetry is a store config whose failed tasks fall due again within a
// millisecond.
func fastRetry(maxAttempts int) task.Config {
	return task.Config{MaxAttempts: maxAttempts, Backoff: task.Backoff{Base: time.Millisecond, Max: time.Millisecond}}
}

func (b *bundle) create(t *testing.T, nt task.NewTask) task.Task {
	t.Helper()
	if nt.Kind == "" {
		nt.Kind = "test"
	}
	if nt.Payload == nil {
		nt.Payload = json.RawMessage(`{"n":1}`)
	}
	r, err := b.store.Create(b.ctx, nt)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return r.Task
}

// start starts one task and fails the test unless the outcome is want.
func (b *bundle) start(t *testing.T, owner string, lease time.Duration, id uuid.UUID, want task.StartOutcome) task.StartResult {
	t.Helper()
	rs, err := b.store.Start(b.ctx, owner, lease, id)
	if err != nil {
		t.Fatalf("Start(%s): %v", owner, err)
	}
	if len(rs) != 1 {
		t.Fatalf("Start(%s) returned %d results, want 1", owner, len(rs))
	}
	if rs[0].Outcome != want {
		t.Fatalf("Start(%s) outcome = %s, want %s (result %+v)", owner, rs[0].Outcome, want, rs[0])
	}
	return rs[0]
}

// startWhenDue calls Start until it changes the task (a start, a takeover or
// a takeover that killed it), polling for at most 5 s: it waits for a
// wall-clock due time (next_retry_at or lease_until).
func (b *bundle) startWhenDue(t *testing.T, owner string, lease time.Duration, id uuid.UUID) task.StartResult {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rs, err := b.store.Start(b.ctx, owner, lease, id)
		if err != nil {
			t.Fatalf("Start(%s): %v", owner, err)
		}
		r := rs[0]
		if r.Outcome == task.Started || r.Outcome == task.TakenOver || r.Outcome == task.DiedOnTakeover {
			return r
		}
		if r.Outcome == task.NotFound || (r.Task != nil && r.Task.Status.Terminal()) {
			t.Fatalf("Start(%s) = %s on a %v task: it will never start", owner, r.Outcome, r.Task)
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s did not become startable within 5s: last result %+v", id, r)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// fail records one failed run and fails the test unless it was applied.
func (b *bundle) fail(t *testing.T, owner string, f task.Failure) task.Result {
	t.Helper()
	rs, err := b.store.Fail(b.ctx, owner, f)
	if err != nil {
		t.Fatalf("Fail(%s): %v", owner, err)
	}
	if len(rs) != 1 || !rs[0].Applied {
		t.Fatalf("Fail(%s) not applied: %+v", owner, rs)
	}
	return rs[0]
}

// failTimes runs the task n times, each run failing, so that attempt_count
// grows by n (it must stay below max_attempts).
func (b *bundle) failTimes(t *testing.T, id uuid.UUID, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		b.startWhenDue(t, "runner", time.Minute, id)
		r := b.fail(t, "runner", task.Failure{ID: id, Error: "boom", RetryAfter: time.Millisecond})
		if r.Status != task.Retrying {
			t.Fatalf("failure %d of %d: status %s, want RETRYING", i+1, n, r.Status)
		}
	}
}

func (b *bundle) get(t *testing.T, id uuid.UUID) task.Task {
	t.Helper()
	tk, err := b.store.Get(b.ctx, id)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return tk
}

func (b *bundle) transitions(t *testing.T, id uuid.UUID) []transition.Record {
	t.Helper()
	recs, err := transition.List(b.ctx, b.db, id)
	if err != nil {
		t.Fatalf("transition.List: %v", err)
	}
	return recs
}

// lastTransition returns the newest audit row of the task.
func (b *bundle) lastTransition(t *testing.T, id uuid.UUID) transition.Record {
	t.Helper()
	recs := b.transitions(t, id)
	if len(recs) == 0 {
		t.Fatalf("task %s has no transitions", id)
	}
	return recs[len(recs)-1]
}

// count returns the result of a count(*) query.
func (b *bundle) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(b.ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// snapshot is everything a refused transition must leave alone: the task row
// (every column, as JSON) and the number of its audit and outbox rows.
type snapshot struct {
	row         string
	transitions int
	outbox      int
}

func (b *bundle) snapshot(t *testing.T, id uuid.UUID) snapshot {
	t.Helper()
	var s snapshot
	err := b.db.QueryRow(b.ctx, `SELECT coalesce((SELECT row_to_json(t)::text FROM ingest_task t WHERE id = $1), ''),
		(SELECT count(*) FROM ingest_task_transition WHERE task_id = $1),
		(SELECT count(*) FROM outbox_event WHERE task_id = $1)`, id).Scan(&s.row, &s.transitions, &s.outbox)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return s
}

// expireLease moves a RUNNING task's lease_until into the past, as if the
// lease had run out: a takeover test without waiting for the wall clock. It
// changes neither the status nor the audit trail.
func (b *bundle) expireLease(t *testing.T, id uuid.UUID) {
	t.Helper()
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET lease_until = now() - interval '1 second'
		WHERE id = $1 AND status = 'RUNNING'`, id); err != nil {
		t.Fatalf("expire lease: %v", err)
	}
}
