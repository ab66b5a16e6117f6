package ingest_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// gate blocks the completer's store calls (BeforeRecord) until it is
// opened, and tells when the first call arrived.
type gate struct {
	entered          chan struct{}
	once, openedOnce sync.Once
	open             chan struct{}
}

// release opens the gate (again: no effect).
func (g *gate) release() { g.openedOnce.Do(func() { close(g.open) }) }

func newGate() *gate { return &gate{entered: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) wait(string) {
	g.once.Do(func() { close(g.entered) })
	<-g.open
}

// runCounter counts the handler runs of each task.
type runCounter struct {
	mu   sync.Mutex
	runs map[uuid.UUID]int
	all  atomic.Int64
}

func (c *runCounter) ran(id uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[uuid.UUID]int{}
	}
	c.runs[id]++
	c.all.Add(1)
}

func (c *runCounter) of(id uuid.UUID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[id]
}

// await waits up to 30 s for ch to be closed.
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting: %s", what)
	}
}

// gatedWorker runs a worker of cfg on n new tasks of kind "k", whose
// handler counts its runs (and calls also, when set) and whose completer's
// store calls wait for the returned gate.
func gatedWorker(t *testing.T, cfg ingest.Config, n int, also func(ingest.Task)) (*bundle, *ingest.Worker, *gate, *runCounter, []uuid.UUID) {
	t.Helper()
	bd := setup(t, realRedis(t), task.Config{})
	g := newGate()
	runs := &runCounter{}
	w, _ := bd.worker(cfg, map[string]ingest.Handler{"k": func(_ context.Context, tk ingest.Task) error {
		runs.ran(tk.ID)
		if also != nil {
			also(tk)
		}
		return nil
	}})
	w.BeforeRecord(g.wait)
	ids := bd.enqueue("k", n, 3)
	bd.run(w)
	t.Cleanup(g.release) // before the worker stops, should the test fail
	return bd, w, g, runs, ids
}

// succeededOnce waits for every task of ids to be SUCCEEDED and checks
// that each ran once.
func (c *runCounter) succeededOnce(bd *bundle, ids []uuid.UUID) {
	bd.t.Helper()
	for _, id := range ids {
		bd.eventually(30*time.Second, "task SUCCEEDED", bd.statusIs(id, task.Succeeded))
		if n := c.of(id); n != 1 {
			bd.t.Errorf("task %s ran %d times, want 1", id, n)
		}
	}
}

// TestSlotReusedWhileOutcomeUnrecorded: with one handler slot, the second
// task's handler starts while the first task's completion is still held
// back before its store call, so the slot came back when the first
// handler returned, not when its outcome committed.
func TestSlotReusedWhileOutcomeUnrecorded(t *testing.T) {
	t.Parallel()
	second := make(chan uuid.UUID, 1)
	var started atomic.Int64
	bd, _, g, runs, ids := gatedWorker(t, ingest.Config{Concurrency: 1}, 2, func(tk ingest.Task) {
		if started.Add(1) == 2 {
			second <- tk.ID
		}
	})

	await(t, g.entered, "the first outcome reached the store call")
	var id uuid.UUID
	select {
	case id = <-second:
	case <-time.After(30 * time.Second):
		t.Fatal("the second task did not start while the first outcome was held back: the slot was not given back at the handler's return")
	}
	first := ids[0]
	if id == first {
		first = ids[1]
	}
	if s := bd.task(first).Status; s != task.Running {
		t.Errorf("first task is %s while its outcome is held back, want RUNNING", s)
	}
	g.release()
	runs.succeededOnce(bd, ids)
}

// TestCompleterQueueBoundsOutcomes: with one slot and a completer of one
// flusher taking batches of one, a held-back store call holds one outcome,
// the gathering loop a second and the queue (capacity 1) a third; the
// fourth handler then waits to hand its outcome over, keeping its slot, so
// no fifth handler runs: the outcomes waiting to be recorded are bounded,
// and so are the tasks started ahead of the held slot (two per slot).
func TestCompleterQueueBoundsOutcomes(t *testing.T) {
	t.Parallel()
	bd, w, g, runs, ids := gatedWorker(t, ingest.Config{Concurrency: 1, CompleteBatch: 1, CompleteParallel: 1}, 10, nil)

	const ahead = 2
	bd.eventually(30*time.Second, "four handlers ran, the fourth holds the slot, two tasks started ahead",
		func() bool {
			return runs.all.Load() == 4 && w.FreeSlots() == 0 && bd.countStatus(task.Running) == 4+ahead
		})
	// The fourth handler cannot give its slot back while the queue is full,
	// so no other handler can have run.
	if n := runs.all.Load(); n != 4 || w.FreeSlots() != 0 {
		t.Errorf("%d handler runs and %d free slots with the completer's queue full, want 4 and 0", n, w.FreeSlots())
	}
	g.release()
	runs.succeededOnce(bd, ids)
}

// TestLeaseRenewedUntilOutcomeRecorded: a run whose handler returned but
// whose outcome is not yet recorded keeps its lease renewed, for longer
// than three leases, and then succeeds without a takeover.
func TestLeaseRenewedUntilOutcomeRecorded(t *testing.T) {
	t.Parallel()
	const lease = 600 * time.Millisecond
	bd, _, g, _, ids := gatedWorker(t, ingest.Config{Concurrency: 1, TaskLease: lease}, 1, nil)
	id := ids[0]

	await(t, g.entered, "the outcome reached the store call")
	tk := bd.task(id)
	if tk.Status != task.Running || tk.LeaseUntil == nil {
		t.Fatalf("task %s, lease %v while its outcome is held back, want RUNNING under a lease", tk.Status, tk.LeaseUntil)
	}
	// Past three leases from the handler's return, the lease must still be
	// live and have moved on: the heartbeat renews it.
	first := *tk.LeaseUntil
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		var live bool
		if err := bd.db.QueryRow(bd.ctx, `SELECT lease_until > now() FROM ingest_task WHERE id = $1`, id).Scan(&live); err != nil || !live {
			t.Fatalf("the lease of the returned, unrecorded run lapsed (live=%v err=%v)", live, err)
		}
		time.Sleep(50 * time.Millisecond) // sampling interval of the lease
	}
	if now := bd.task(id); now.LeaseUntil == nil || !now.LeaseUntil.After(first.Add(2*lease)) {
		t.Errorf("lease_until %v after three leases, want renewed past %v", now.LeaseUntil, first.Add(2*lease))
	}
	g.release()
	bd.eventually(30*time.Second, "task SUCCEEDED", bd.statusIs(id, task.Succeeded))
	if p, want := bd.path(id), "QUEUED→RUNNING→SUCCEEDED"; p != want {
		t.Errorf("transitions %q, want %q (no takeover)", p, want)
	}
}

// TestNoSecondRunWhenCompleterIsSlow: two workers with reclaimers share a
// stream while every completion takes longer than three leases; no task
// is taken over or run twice, since the runs waiting for their outcomes to
// be recorded keep their leases and their entries fresh.
func TestNoSecondRunWhenCompleterIsSlow(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	const lease = 600 * time.Millisecond
	var runs runCounter
	slow := func(string) {
		t := time.NewTimer(3 * lease) // a slow completer, not a synchronisation
		defer t.Stop()
		<-t.C
	}
	handler := map[string]ingest.Handler{"k": func(_ context.Context, tk ingest.Task) error {
		runs.ran(tk.ID)
		return nil
	}}
	var ws []*ingest.Worker
	for _, name := range []string{"w1", "w2"} {
		w, _ := bd.worker(ingest.Config{Consumer: name, Concurrency: 4, TaskLease: lease}, handler)
		w.BeforeRecord(slow)
		ws = append(ws, w)
	}
	ids := bd.enqueue("k", 40, 3)
	for _, w := range ws {
		bd.run(w)
		bd.reclaim(w, lease)
	}
	bd.eventually(60*time.Second, "every task SUCCEEDED", func() bool { return bd.countStatus(task.Succeeded) == len(ids) })
	for _, id := range ids {
		if n := runs.of(id); n != 1 {
			t.Errorf("task %s ran %d times, want 1", id, n)
		}
		if p, want := bd.path(id), "QUEUED→RUNNING→SUCCEEDED"; p != want {
			t.Errorf("task %s transitions %q, want %q", id, p, want)
		}
	}
}
