package maintenance_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

func lingering(t *testing.T, db *pgxpool.Pool, id uuid.UUID) bool {
	t.Helper()
	var l *bool
	if err := db.QueryRow(context.Background(), `SELECT lingering FROM ingest_task WHERE id = $1`, id).Scan(&l); err != nil {
		t.Fatal(err)
	}
	return l != nil && *l
}

func createTask(t *testing.T, db *pgxpool.Pool) uuid.UUID {
	t.Helper()
	s, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Create(context.Background(), task.NewTask{Kind: "lw", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	return r.Task.ID
}

// TestLowWaterPassWaitsForAnOpenInsert: a pass publishes a cutoff and
// raises the low water to it when no transaction that may be inserting
// is open; while one that inserted before the cutoff is open, the passes
// leave the low water where it is, and the first pass after it commits
// raises it, marking its task lingering.
func TestLowWaterPassWaitsForAnOpenInsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	w, err := maintenance.NewLowWater(maintenance.LowWaterConfig{Lag: time.Millisecond}, db, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	first := createTask(t, db)
	// The first task's id is below the cutoff once a millisecond passed.
	testenv.Eventually(t, 10*time.Second, "a pass to raise the low water past the first task", func() bool {
		res, err := w.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res.Advanced && lingering(t, db, first)
	})

	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	s, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.CreateTx(ctx, tx, task.NewTask{Kind: "lw", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	inTx := rs[0].Task.ID
	var published uuid.UUID
	testenv.Eventually(t, 10*time.Second, "a pass to publish a cutoff past the open transaction's task", func() bool {
		res, err := w.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Advanced {
			t.Fatalf("the low water was raised while a transaction that inserted before its cutoff is open: %+v", res)
		}
		published = res.Published
		return published != uuid.Nil && res.Waiting >= 1
	})
	low := func() uuid.UUID {
		t.Helper()
		st, err := task.ReadLowWater(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		return st.Low
	}
	before := low()
	for range 3 {
		if res, err := w.RunOnce(ctx); err != nil || res.Advanced || res.Published != uuid.Nil {
			t.Fatalf("pass while waiting = %+v, %v; want nothing raised or published", res, err)
		}
	}
	if l := low(); l != before {
		t.Fatalf("low water moved from %s to %s while waiting", before, l)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The pass raises the low water to the pending cutoff (and may then
	// publish the next one and raise it at once).
	res, err := w.RunOnce(ctx)
	if err != nil || !res.Advanced || res.Marked < 1 || bytes.Compare(res.Low[:], published[:]) < 0 {
		t.Fatalf("pass after the commit = %+v, %v; want raised to %s or past it, marking the task", res, err, published)
	}
	if !lingering(t, db, inTx) {
		t.Fatal("the task inserted before the cutoff is not lingering below the low water")
	}
}

// TestLowWaterRunsOnlyOnTheLeader: the leader's passes raise the low
// water; a follower runs none.
func TestLowWaterRunsOnlyOnTheLeader(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	cfg := maintenance.Config{
		Elector:         maintenance.ElectorConfig{TTL: 30 * time.Second, RetryInterval: 20 * time.Millisecond},
		RescuerDisabled: true, ConsumersDisabled: true, RetentionDisabled: true, ReleaserDisabled: true, PartitionsDisabled: true,
		LowWater: maintenance.LowWaterConfig{Interval: 20 * time.Millisecond, Lag: time.Millisecond},
	}
	id := createTask(t, db)
	a := startElected(t, cfg, db)
	testenv.Eventually(t, 10*time.Second, "a to lead", a.m.IsLeader)
	b := startElected(t, cfg, db)
	testenv.Eventually(t, 30*time.Second, "the low water to pass the task", func() bool { return lingering(t, db, id) })
	testenv.Eventually(t, 10*time.Second, "a's low-water passes", func() bool { return len(a.rec.times(&a.rec.passEnds)) >= 3 })
	if b.m.IsLeader() || len(b.rec.times(&b.rec.passBegin)) != 0 {
		t.Errorf("the follower ran %d passes (leader: %v)", len(b.rec.times(&b.rec.passBegin)), b.m.IsLeader())
	}
}
