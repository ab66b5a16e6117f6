package maintenance_test

import (
	"maps"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// TestReleaserWakesParkedTasks: the releaser releases a concurrency-limited
// kind's parked tasks when a crashed worker's lease expires, never more
// than the free slots even across passes (the released tasks count as in
// transit until they start), and a rate-limited kind's when its window
// moves on; ingest_kind_waiting_tasks reports the parked tasks by reason.
func TestReleaserWakesParkedTasks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	// The first pass counts the parked tasks; the gauge reports that count
	// while it is younger than three intervals, so the interval must
	// outlast the time from that pass to the Gather below on a loaded
	// machine (1 ms did not, in CI).
	r, err := maintenance.NewReleaser(maintenance.ReleaserConfig{WaitingInterval: time.Second}, store, reg)
	if err != nil {
		t.Fatal(err)
	}
	// The leases and the rate window must outlast the time from the starts
	// to the first pass below on a loaded machine (200 ms and 300 ms did
	// not, in CI): nothing may be free at that pass.
	const hold = 5 * time.Second
	two, rate, yes := 2, task.Rate{Count: 1, Per: hold}, true
	for kind, u := range map[string]task.KindUpdate{
		"c": {Concurrency: &two}, "r": {Rate: &rate}, "p": {Paused: &yes},
	} {
		if _, err := store.SetKind(ctx, "test", kind, u); err != nil {
			t.Fatal(err)
		}
	}
	create := func(kind string, n int) []task.StartResult {
		nts := make([]task.NewTask, n)
		for i := range nts {
			nts[i] = task.NewTask{Kind: kind, Payload: []byte(`{}`)}
		}
		res, err := store.CreateBatch(ctx, nts)
		if err != nil {
			t.Fatal(err)
		}
		var ids []task.StartResult
		for _, c := range res {
			ids = append(ids, task.StartResult{ID: c.Task.ID})
		}
		return ids
	}
	startAll := func(kind string, rs []task.StartResult, lease time.Duration) (started int) {
		for _, x := range rs {
			out, err := store.StartLimited(ctx, "w", lease, kind, x.ID)
			if err != nil {
				t.Fatal(err)
			}
			if out[0].Outcome == task.Started {
				started++
			}
		}
		return started
	}
	cs := create("c", 6)
	if n := startAll("c", cs, hold); n != 2 {
		t.Fatalf("%d of c started, want 2 (its limit)", n)
	}
	rs := create("r", 3)
	if n := startAll("r", rs, time.Minute); n != 1 {
		t.Fatalf("%d of r started, want 1 (its rate)", n)
	}
	if _, err := store.Park(ctx, create("p", 1)[0].ID); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 0 {
		t.Fatalf("first pass released %d, %v; want nothing (no slot, no start free)", n, err)
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ingest_kind_waiting_tasks" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["kind"]+"/"+labels["reason"]] = m.GetGauge().GetValue()
		}
	}
	if want := map[string]float64{"c/limit": 4, "r/limit": 2, "p/paused": 1}; !maps.Equal(got, want) {
		t.Fatalf("ingest_kind_waiting_tasks = %v, want %v", got, want)
	}
	// The two c leases expire and the rate window moves on (hold): 2 of c
	// and 1 of r are released, and no more while they are in transit.
	var released int
	testenv.Eventually(t, 12*hold, "the releaser releases 3", func() bool {
		n, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		released += n
		if released > 3 {
			t.Fatalf("released %d, more than the 2 slots and 1 start that are free", released)
		}
		return released == 3
	})
	for range 3 {
		if n, err := r.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("a pass with the released tasks in transit released %d more, %v", n, err)
		}
	}
}

// TestReleaserFreesStrandedParkedTasks: parked tasks of a kind that is
// neither paused nor limited (a resume committed, and its process died
// before it released them) are released by the releaser's next count,
// each with a new outbox event, and are not reported as waiting.
func TestReleaserFreesStrandedParkedTasks(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	r, err := maintenance.NewReleaser(maintenance.ReleaserConfig{}, store, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetPaused(ctx, "test", "s", true); err != nil {
		t.Fatal(err)
	}
	nts := make([]task.NewTask, 3)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "s", Payload: []byte(`{}`)}
	}
	res, err := store.CreateBatch(ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for _, c := range res {
		ids = append(ids, c.Task.ID)
	}
	if parked, err := store.Park(ctx, ids...); err != nil || len(parked) != 3 {
		t.Fatalf("Park = %v, %v", parked, err)
	}
	// The resume's commit, without its release.
	if _, err := db.Exec(ctx, `UPDATE ingest_kind SET paused = false WHERE kind = 's'`); err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("the releaser's pass released %d, %v; want the 3 stranded tasks", n, err)
	}
	for _, id := range ids {
		tk, err := store.Get(ctx, id)
		if err != nil || tk.Parked() {
			t.Fatalf("task %+v, %v after the pass; want released", tk, err)
		}
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id).Scan(&n); err != nil || n != 2 {
			t.Fatalf("task %s has %d outbox events, %v; want 2 (create and release)", id, n, err)
		}
	}
}
