package task_test

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestCompletionIsHOT: a completion writes each task once, a HOT update:
// no index names a column it changes, finished_at included (migration
// 00025). The success; and the failure that ends a task (DEAD) with the
// error it failed with before (a first failure writes last_error, which
// ingest_task_failed_idx names, so it cannot be HOT). The tasks fit on one
// page with every version the transaction makes of them: a page without
// room takes the new version elsewhere, which is not HOT either.
// pg_stat_xact_user_tables counts the backend's updates not yet reported,
// this transaction's among them: the completion's are the difference.
func TestCompletionIsHOT(t *testing.T) {
	for _, end := range []task.State{task.Succeeded, task.Dead} {
		t.Run(string(end), func(t *testing.T) {
			b := setup(t, fastRetry(5))
			const n = 10
			ids := make([]uuid.UUID, n)
			for i := range ids {
				ids[i] = b.create(t, task.NewTask{}).ID
			}
			for _, id := range ids {
				b.start(t, "w1", time.Hour, id, task.Started)
				if end == task.Dead {
					if _, err := b.store.Fail(b.ctx, "w1", task.Failure{ID: id, Error: "boom"}); err != nil {
						t.Fatal(err)
					}
					if r := b.startWhenDue(t, "w1", time.Hour, id); r.Outcome != task.Started {
						t.Fatalf("second start %+v", r)
					}
				}
			}
			tx, err := b.db.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(b.ctx) }()
			counts := func() (upd, hot int64) {
				t.Helper()
				if err := tx.QueryRow(b.ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'ingest_task'`).Scan(&upd, &hot); err != nil {
					t.Fatal(err)
				}
				return upd, hot
			}
			upd0, hot0 := counts()
			s, err := task.NewStore(fastRetry(5), tx)
			if err != nil {
				t.Fatal(err)
			}
			var res []task.Result
			if end == task.Succeeded {
				res, err = s.Succeed(b.ctx, "w1", ids...)
			} else {
				fails := make([]task.Failure, n)
				for i, id := range ids {
					fails[i] = task.Failure{ID: id, Error: "boom", Permanent: true}
				}
				res, err = s.Fail(b.ctx, "w1", fails...)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				if !r.Applied || r.Status != end || r.FinishedAt == nil {
					t.Fatalf("completion result %+v, want applied, %s, finished", r, end)
				}
			}
			upd, hot := counts()
			if upd-upd0 != n || hot-hot0 != n {
				t.Fatalf("the completion (%s) of %d tasks made %d updates, %d of them HOT; want %d and %d", end, n, upd-upd0, hot-hot0, n, n)
			}
		})
	}
}

// unfinishedFound returns the tasks among want that each reader of the
// unfinished tasks misses, by reader: the listing of the state, the
// rescuer's pages of its class, and the capped count (which must count
// every task in the state once, want being all of them).
func unfinishedFound(t *testing.T, b *bundle, st task.State, want []uuid.UUID) map[string][]uuid.UUID {
	t.Helper()
	missing := map[string][]uuid.UUID{}
	listed, _, err := b.store.List(b.ctx, task.ListParams{Status: st, Limit: task.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	var listedIDs []uuid.UUID
	for _, x := range listed {
		listedIDs = append(listedIDs, x.ID)
	}
	class := map[task.State]task.RescueClass{task.Queued: task.RescueQueued, task.Retrying: task.RescueRetrying, task.Running: task.RescueRunning}[st]
	var rescued []uuid.UUID
	var cur task.RescueCursor
	for {
		page, err := task.RescueCandidates(b.ctx, b.db, class, cur, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range page.Candidates {
			rescued = append(rescued, c.ID)
		}
		if !page.More {
			break
		}
		cur = page.Next
	}
	for _, id := range want {
		if !slices.Contains(listedIDs, id) {
			missing["list"] = append(missing["list"], id)
		}
		if st != task.Running && !slices.Contains(rescued, id) {
			missing["rescue"] = append(missing["rescue"], id)
		}
	}
	if len(listedIDs) != len(want) {
		t.Errorf("listing %s: %d tasks, want %d (each once)", st, len(listedIDs), len(want))
	}
	if st != task.Running && len(rescued) != len(want) {
		t.Errorf("rescuer's %s pages: %d tasks, want %d (each once)", st, len(rescued), len(want))
	}
	counts, err := task.CappedCounts(b.ctx, b.db, []task.State{st}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if counts[st] != int64(len(want)) {
		t.Errorf("capped count of %s = %d, want %d", st, counts[st], len(want))
	}
	live, _, complete, err := task.LiveCounts(b.ctx, b.db, 100000)
	if err != nil {
		t.Fatal(err)
	}
	if !complete || live[st] != int64(len(want)) {
		t.Errorf("live count of %s = %d (complete: %v), want %d", st, live[st], complete, len(want))
	}
	return missing
}

func lingering(t *testing.T, b *bundle, id uuid.UUID) bool {
	t.Helper()
	var l *bool
	if err := b.db.QueryRow(b.ctx, `SELECT lingering FROM ingest_task WHERE id = $1`, id).Scan(&l); err != nil {
		t.Fatal(err)
	}
	return l != nil && *l
}

// TestLowWaterWaitsForInsertsBeforeItsCutoff: a task inserted, by a
// transaction still open, before a cutoff was published (so without
// reading it) keeps the low water where it is until that transaction
// ends; then the raise marks it lingering with the tasks created before,
// and every reader of the unfinished tasks finds all of them, with the
// tasks created after the publication, which marked themselves.
func TestLowWaterWaitsForInsertsBeforeItsCutoff(t *testing.T) {
	b := setup(t, task.Config{})
	before := b.create(t, task.NewTask{}).ID
	tx, err := b.db.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	rs, err := b.store.CreateTx(b.ctx, tx, task.NewTask{Kind: "test", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	inTx := rs[0].Task.ID

	// A cutoff a minute ahead: every id created until then is below it.
	cutoff, waiting, err := task.PublishLowWater(b.ctx, b.db, -time.Minute)
	if err != nil || cutoff == uuid.Nil || waiting != 1 {
		t.Fatalf("PublishLowWater = %s, waiting for %d, %v; want a cutoff waiting for the open transaction", cutoff, waiting, err)
	}
	if again, _, err := task.PublishLowWater(b.ctx, b.db, -time.Minute); err != nil || again != uuid.Nil {
		t.Fatalf("second PublishLowWater = %s, %v; want none while one is pending", again, err)
	}
	after := b.create(t, task.NewTask{}).ID
	if !lingering(t, b, after) {
		t.Fatal("a task created below the published cutoff is not lingering")
	}
	ok, _, _, err := task.AdvanceLowWater(b.ctx, b.db)
	if err != nil || ok {
		t.Fatalf("AdvanceLowWater with the inserting transaction open = %v, %v; want no raise", ok, err)
	}
	if w, err := task.ReadLowWater(b.ctx, b.db); err != nil || w.Low != uuid.Nil || w.Pending != cutoff || !w.Waiting {
		t.Fatalf("low water %+v, %v; want the zero uuid, %s pending and waiting", w, err, cutoff)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	ok, low, marked, err := task.AdvanceLowWater(b.ctx, b.db)
	if err != nil || !ok || low != cutoff || marked != 2 {
		t.Fatalf("AdvanceLowWater = %v, %s, %d marked, %v; want raised to %s, marking the 2 tasks of before", ok, low, marked, err, cutoff)
	}
	for _, id := range []uuid.UUID{before, inTx, after} {
		if !lingering(t, b, id) {
			t.Errorf("task %s below the low water is not lingering", id)
		}
	}
	if m := unfinishedFound(t, b, task.Queued, []uuid.UUID{before, inTx, after}); len(m) > 0 {
		t.Fatalf("readers miss tasks: %v", m)
	}
}

// TestLowWaterReadersSplitAtTheLowWater: with the low water between the
// tasks, the readers of the unfinished tasks find the recent ones on the
// primary key and the lingering ones (those below it, and a redriven
// task above it) on their index, each once, and none of the finished.
func TestLowWaterReadersSplitAtTheLowWater(t *testing.T) {
	b := setup(t, task.Config{})
	var ids []uuid.UUID
	for range 6 {
		ids = append(ids, b.create(t, task.NewTask{}).ID)
	}
	// ids[4] ends and is redriven: lingering above the low water.
	if _, err := b.store.Cancel(b.ctx, "op", "", ids[4]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Redrive(b.ctx, "op", ids[4]); err != nil {
		t.Fatal(err)
	}
	// ids[1] and ids[5] finish.
	for _, id := range []uuid.UUID{ids[1], ids[5]} {
		if _, err := b.store.Cancel(b.ctx, "op", "", id); err != nil {
			t.Fatal(err)
		}
	}
	// The low water at ids[3], as a raise leaves it: the unfinished tasks
	// below it lingering.
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET lingering = true WHERE id < $1 AND finished_at IS NULL`, ids[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task_low_water SET low = $1`, ids[3]); err != nil {
		t.Fatal(err)
	}
	if m := unfinishedFound(t, b, task.Queued, []uuid.UUID{ids[0], ids[2], ids[3], ids[4]}); len(m) > 0 {
		t.Fatalf("readers miss tasks: %v", m)
	}
}

// TestLowWaterRedrivenTaskFound: a task that finished below the low water
// and is redriven is found by every reader of the unfinished tasks, and
// lingering is cleared once it finishes again.
func TestLowWaterRedrivenTaskFound(t *testing.T) {
	b := setup(t, task.Config{})
	id := b.create(t, task.NewTask{}).ID
	if _, err := b.store.Cancel(b.ctx, "op", "", id); err != nil {
		t.Fatal(err)
	}
	if cutoff, _, err := task.PublishLowWater(b.ctx, b.db, -time.Minute); err != nil || cutoff == uuid.Nil {
		t.Fatalf("PublishLowWater = %s, %v", cutoff, err)
	}
	if ok, _, marked, err := task.AdvanceLowWater(b.ctx, b.db); err != nil || !ok || marked != 0 {
		t.Fatalf("AdvanceLowWater = %v, %d marked, %v; want raised, marking nothing (the task is finished)", ok, marked, err)
	}
	if lingering(t, b, id) {
		t.Fatal("a finished task was marked lingering")
	}
	if res, err := b.store.Redrive(b.ctx, "op", id); err != nil || len(res) != 1 || !res[0].Applied {
		t.Fatalf("Redrive = %+v, %v", res, err)
	}
	if m := unfinishedFound(t, b, task.Queued, []uuid.UUID{id}); len(m) > 0 {
		t.Fatalf("readers miss the redriven task: %v", m)
	}
	if n, err := task.ClearLingering(b.ctx, b.db, 100); err != nil || n != 0 {
		t.Fatalf("ClearLingering = %d, %v; want the unfinished task left lingering", n, err)
	}
	if _, err := b.store.Cancel(b.ctx, "op", "", id); err != nil {
		t.Fatal(err)
	}
	if n, err := task.ClearLingering(b.ctx, b.db, 100); err != nil || n != 1 || lingering(t, b, id) {
		t.Fatalf("ClearLingering = %d, %v; want the finished task cleared", n, err)
	}
}
