package ui

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// storeWithTasks returns a database of the test's own, a store on it and
// the ids of the QUEUED tasks it created in one batch: n of each kind.
func storeWithTasks(t *testing.T, n map[string]int) (*pgxpool.Pool, *task.Store, map[string][]uuid.UUID) {
	t.Helper()
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	var nts []task.NewTask
	for kind, k := range n {
		for range k {
			nts = append(nts, task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`)})
		}
	}
	res, err := store.CreateBatch(context.Background(), nts)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][]uuid.UUID{}
	for _, r := range res {
		ids[r.Task.Kind] = append(ids[r.Task.Kind], r.Task.ID)
	}
	return db, store, ids
}

// TestSeriesDoesNotWaitForTheAuditReads: the charts are read by the
// sampler's own goroutine. A request returns while that read is blocked
// (here by a lock on the audit table) with what was read so far, and the
// charts fill in once the read goes through; a backlog larger than one
// pass's batch is read over several passes, and Behind is clear after.
func TestSeriesDoesNotWaitForTheAuditReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _, _ := storeWithTasks(t, map[string]int{"chart": 25})
	s := newSampler(db)
	s.batch = 10

	lock, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE ingest_task_transition IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	got, err := s.Series(ctx) // returns although the sampler's read waits for the lock
	if err != nil {
		t.Fatalf("Series while the audit table is locked: %v", err)
	}
	if got.Totals.Created != 0 {
		t.Fatalf("%d creations counted while the audit table was locked", got.Totals.Created)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 60*time.Second, "the 25 creations in the charts", func() bool {
		got, err := s.Series(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got.Totals.Created == 25
	})
	got, _ = s.Series(ctx)
	if got.Behind {
		t.Error("Behind is still set once every audit row was read")
	}
	if _, ok := got.ByKind[""]; ok {
		t.Error(`the charts' kinds hold "", the kind of rows not read by kind`)
	}
}

// TestOverviewCountsUnfinishedTasksEitherWay: the overview's counts of
// unfinished tasks, by status and by kind, are the same whether they come
// from one walk of the unfinished tasks (fewer than liveCap) or, past it,
// from a capped count per status.
func TestOverviewCountsUnfinishedTasksEitherWay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store, created := storeWithTasks(t, map[string]int{"a": 3, "b": 1})
	if _, err := store.Start(ctx, "w", time.Minute, created["a"][0]); err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Store: store, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	for _, liveCap := range []int{h.liveCap, 1} {
		h.liveCap = liveCap
		d, err := h.readOverview(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[task.State]int64{}
		for _, s := range d.Statuses {
			got[s.State] = s.N
		}
		if got[task.Queued] != 3 || got[task.Running] != 1 {
			t.Errorf("liveCap %d: statuses %v, want 3 QUEUED and 1 RUNNING", liveCap, got)
		}
		kinds := map[string][2]int64{}
		for _, k := range d.Kinds {
			kinds[k.Kind] = [2]int64{k.Waiting, k.Running}
		}
		if kinds["a"] != [2]int64{2, 1} || kinds["b"] != [2]int64{1, 0} {
			t.Errorf("liveCap %d: kinds (waiting, running) %v, want a: 2, 1 and b: 1, 0", liveCap, kinds)
		}
	}
}
