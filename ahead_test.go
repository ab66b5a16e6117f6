package ingest_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// blockingHandler runs tasks until release is closed: it counts the runs
// of each task, the most handlers at once, and sends each task's id on
// started (buffered by the caller).
type blockingHandler struct {
	runs    runCounter
	now     atomic.Int64
	most    atomic.Int64
	started chan uuid.UUID
	release chan struct{}
	once    sync.Once
}

// open lets every handler return (again: no effect).
func (h *blockingHandler) open() { h.once.Do(func() { close(h.release) }) }

func newBlockingHandler(n int) *blockingHandler {
	return &blockingHandler{started: make(chan uuid.UUID, n), release: make(chan struct{})}
}

func (h *blockingHandler) handle(_ context.Context, tk ingest.Task) error {
	n := h.now.Add(1)
	defer h.now.Add(-1)
	for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
	}
	h.runs.ran(tk.ID)
	h.started <- tk.ID
	<-h.release
	return nil
}

// aheadRun is a worker of one handler slot (unless cfg says otherwise)
// running n new tasks of kind with a blockingHandler, whose first run has
// begun.
type aheadRun struct {
	bd    *bundle
	w     *ingest.Worker
	h     *blockingHandler
	ids   []uuid.UUID
	first uuid.UUID // the task whose handler runs
	stop  func()
}

// startAhead returns an aheadRun once its first handler runs; before, when
// set, is called before the worker runs. The worker first runs a task of
// kind "quick", whose handler returns at once: nothing is started ahead
// until a handler has returned quickly.
func startAhead(t *testing.T, cfg ingest.Config, kind string, n int, before func(*bundle, *ingest.Worker)) *aheadRun {
	t.Helper()
	bd := setup(t, realRedis(t), task.Config{})
	h := newBlockingHandler(n)
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	w, _ := bd.worker(cfg, map[string]ingest.Handler{kind: h.handle, "quick": func(context.Context, ingest.Task) error { return nil }})
	if before != nil {
		before(bd, w)
	}
	stop := bd.run(w)
	t.Cleanup(h.open) // before the worker stops, should the test fail
	quick := bd.enqueue("quick", 1, 3)[0]
	bd.eventually(30*time.Second, "the quick task SUCCEEDED", bd.statusIs(quick, task.Succeeded))
	ids := bd.enqueue(kind, n, 3)
	return &aheadRun{bd: bd, w: w, h: h, ids: ids, first: <-h.started, stop: stop}
}

// others returns the tasks but the first.
func (a *aheadRun) others() []uuid.UUID {
	var out []uuid.UUID
	for _, id := range a.ids {
		if id != a.first {
			out = append(out, id)
		}
	}
	return out
}

// runOneAtATime lets every handler return, and checks that each task ran
// once and that no two handlers ran at once (one slot).
func (a *aheadRun) runOneAtATime(t *testing.T) {
	t.Helper()
	a.h.open()
	a.h.runs.succeededOnce(a.bd, a.ids)
	if m := a.h.most.Load(); m != 1 {
		t.Errorf("%d handlers ran at once with one slot", m)
	}
}

// TestTasksStartedAheadOfHandlerSlots: while the one handler slot is
// busy, the next tasks are started (RUNNING under the worker's lease) up
// to twice the slots, their handlers not called; once the slot frees they
// run one at a time, each once.
func TestTasksStartedAheadOfHandlerSlots(t *testing.T) {
	t.Parallel()
	a := startAhead(t, ingest.Config{}, "k", 5, nil)
	bd, h, first := a.bd, a.h, a.first
	bd.eventually(30*time.Second, "two tasks started ahead of the busy slot",
		func() bool { return bd.countStatus(task.Running) == 3 })
	if n := h.runs.all.Load(); n != 1 {
		t.Fatalf("%d handlers called with one slot, want 1", n)
	}
	if n := bd.countStatus(task.Running); n != 3 {
		t.Fatalf("%d tasks RUNNING, want the running one and the two started ahead", n)
	}
	if s := bd.task(first).Status; s != task.Running {
		t.Fatalf("the running task is %s", s)
	}
	a.runOneAtATime(t)
}

// TestCancelOfATaskStartedAhead: a task started ahead of the busy slot
// and cancelled while it waits ends CANCELLED without its handler being
// called.
func TestCancelOfATaskStartedAhead(t *testing.T) {
	t.Parallel()
	a := startAhead(t, ingest.Config{}, "k", 2, nil)
	bd, h, first, waiting := a.bd, a.h, a.first, a.others()[0]
	bd.eventually(30*time.Second, "the second task started ahead", bd.statusIs(waiting, task.Running))
	if r, err := bd.store.Cancel(bd.ctx, "api:test", "enough", waiting); err != nil || r.Outcome != task.CancelRequested {
		t.Fatalf("Cancel = %+v, %v", r, err)
	}
	bd.eventually(30*time.Second, "the waiting task CANCELLED", bd.statusIs(waiting, task.Cancelled))
	if n := h.runs.of(waiting); n != 0 {
		t.Errorf("the cancelled task's handler ran %d times, want 0", n)
	}
	h.open()
	bd.eventually(30*time.Second, "the running task SUCCEEDED", bd.statusIs(first, task.Succeeded))
	bd.eventually(30*time.Second, "both entries acknowledged", func() bool { return bd.pending() == 0 })
}

// TestShutdownReleasesTasksStartedAhead: at shutdown the tasks started
// ahead and still waiting are released at once (RETRYING, no attempt
// counted), their handlers not called, while the running handler finishes
// in the grace period; another worker then runs each of them once.
func TestShutdownReleasesTasksStartedAhead(t *testing.T) {
	t.Parallel()
	const idle = 200 * time.Millisecond
	a := startAhead(t, ingest.Config{ShutdownTimeout: time.Minute, ReclaimIdle: idle}, "k", 3, nil)
	bd, h, ids, first := a.bd, a.h, a.ids, a.first
	bd.eventually(30*time.Second, "two tasks started ahead", func() bool { return bd.countStatus(task.Running) == 3 })
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		a.stop()
	}()
	for _, id := range a.others() {
		bd.eventually(30*time.Second, "a waiting task released", bd.statusIs(id, task.Retrying))
		tk := bd.task(id)
		if tk.AttemptCount != 0 {
			t.Errorf("released task has attempt_count %d, want 0", tk.AttemptCount)
		}
		if got, want := bd.path(id), "QUEUED→RUNNING→RETRYING"; got != want {
			t.Errorf("released task's audit %s, want %s", got, want)
		}
	}
	if s := bd.task(first).Status; s != task.Running {
		t.Errorf("the running task is %s during the grace period, want RUNNING", s)
	}
	h.open()
	await(t, stopped, "the worker stopped")
	if s := bd.task(first).Status; s != task.Succeeded {
		t.Errorf("the task running at shutdown is %s, want SUCCEEDED within the grace period", s)
	}

	// Two slots: the stand-in reclaimer (bd.reclaim) needs one beside the
	// one the blocking read holds.
	w2, _ := bd.worker(ingest.Config{Concurrency: 2, ReclaimIdle: idle}, map[string]ingest.Handler{"k": h.handle})
	bd.reclaim(w2, idle)
	bd.run(w2)
	h.runs.succeededOnce(bd, ids)
}

// staleWait starts two tasks of one slot with a lease of 4 s and the
// heartbeat skipped once the second has been started ahead; between and
// after, between runs what the test does to the waiting task's row. It
// returns once the waiting task's lease has gone unrenewed for over two
// thirds of a lease, the first handler still running.
func staleWait(t *testing.T, between func(bd *bundle, waiting uuid.UUID)) (a *aheadRun, waiting uuid.UUID, skip *atomic.Bool) {
	t.Helper()
	const lease = 4 * time.Second
	skip = new(atomic.Bool)
	a = startAhead(t, ingest.Config{TaskLease: lease, ReclaimIdle: 200 * time.Millisecond}, "k", 2,
		func(_ *bundle, w *ingest.Worker) { w.SkipBeats(skip.Load) })
	waiting = a.others()[0]
	a.bd.eventually(30*time.Second, "the second task started ahead", a.bd.statusIs(waiting, task.Running))
	skip.Store(true)
	if between != nil {
		between(a.bd, waiting)
	}
	// The behaviour is a time bound: no renewal for over two thirds of a
	// lease (the running task's lease, taken later, still holds).
	time.Sleep(lease*2/3 + lease/10)
	return a, waiting, skip
}

// TestStaleLeaseConfirmedBeforeRun: a task started ahead whose lease went
// unrenewed for two thirds of a lease while it waited for a handler slot
// (the heartbeat late: here skipped) has its lease confirmed when the slot
// comes to it, and runs once, never released.
func TestStaleLeaseConfirmedBeforeRun(t *testing.T) {
	t.Parallel()
	a, waiting, _ := staleWait(t, nil)
	bd := a.bd
	a.runOneAtATime(t)
	if got, want := bd.path(waiting), "QUEUED→RUNNING→SUCCEEDED"; got != want {
		t.Errorf("the task whose lease went unrenewed: audit %s, want %s", got, want)
	}
}

// TestLostLeaseOfAWaitingTaskNotRun: a task started ahead whose lease
// another worker took while it waited (the heartbeat, skipped, did not
// notice) is not run when the slot comes to it: the confirmation finds the
// lease lost, and the row is left to its holder.
func TestLostLeaseOfAWaitingTaskNotRun(t *testing.T) {
	t.Parallel()
	a, waiting, _ := staleWait(t, func(bd *bundle, waiting uuid.UUID) {
		// What a takeover leaves: the row RUNNING under another owner.
		if _, err := bd.db.Exec(bd.ctx, `UPDATE ingest_task SET lease_owner = 'elsewhere' WHERE id = $1`, waiting); err != nil {
			t.Fatal(err)
		}
	})
	bd, h := a.bd, a.h
	h.open()
	bd.eventually(30*time.Second, "the running task SUCCEEDED", bd.statusIs(a.first, task.Succeeded))
	// Its outcome goes to the completer, whose guard refuses it: the entry
	// stays pending, for the worker holding the task.
	bd.eventually(30*time.Second, "the waiting task's outcome refused", func() bool {
		return bd.logs.count("task outcome not recorded: lease lost") == 1
	})
	if n := bd.logs.count("task lease lost while it waited for a handler slot"); n != 1 {
		t.Errorf("%d log lines of the lost lease found by its confirmation, want 1", n)
	}
	if n := h.runs.of(waiting); n != 0 {
		t.Errorf("the handler of the task whose lease was lost ran %d times, want 0", n)
	}
	if tk := bd.task(waiting); tk.Status != task.Running || tk.LeaseOwner != "elsewhere" || tk.AttemptCount != 0 {
		t.Errorf("the taken-over task is %s, owner %q, attempt_count %d: want RUNNING under elsewhere, 0", tk.Status, tk.LeaseOwner, tk.AttemptCount)
	}
	if got, want := bd.path(waiting), "QUEUED→RUNNING"; got != want {
		t.Errorf("the taken-over task: audit %s, want %s", got, want)
	}
}

// TestStaleLeaseReleasedUnrunWhenConfirmFails: a task started ahead whose
// lease cannot be confirmed when the slot comes to it (the renewal fails:
// here its connection is terminated while it waits for a row lock) is
// released unrun, never run on a lease that may have lapsed; it then runs
// once.
func TestStaleLeaseReleasedUnrunWhenConfirmFails(t *testing.T) {
	t.Parallel()
	var lock pgx.Tx
	a, waiting, skip := staleWait(t, func(bd *bundle, waiting uuid.UUID) {
		var err error
		if lock, err = bd.db.Begin(bd.ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
		if _, err := lock.Exec(bd.ctx, `SELECT 1 FROM ingest_task WHERE id = $1 FOR UPDATE`, waiting); err != nil {
			t.Fatal(err)
		}
	})
	bd, h := a.bd, a.h
	h.open()
	var me int
	if err := lock.QueryRow(bd.ctx, `SELECT pg_backend_pid()`).Scan(&me); err != nil {
		t.Fatal(err)
	}
	// blocked returns the backends waiting for the row lock whose
	// statement holds text.
	blocked := func(text string) []int {
		var pids []int
		err := bd.db.QueryRow(bd.ctx, `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)) AND strpos(query, $2) > 0`, me, text).Scan(&pids)
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	// The confirmation waits for the lock; its connection is cut.
	var renewal []int
	bd.eventually(30*time.Second, "the confirmation waits for the row lock", func() bool {
		renewal = blocked("lease_until = now() +")
		return len(renewal) > 0
	})
	if _, err := bd.db.Exec(bd.ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS x(pid)`, renewal); err != nil {
		t.Fatal(err)
	}
	// The release that follows waits for the lock too.
	bd.eventually(30*time.Second, "the release waits for the row lock", func() bool { return len(blocked("RETRYING")) > 0 })
	if n := h.runs.of(waiting); n != 0 {
		t.Errorf("the task whose lease could not be confirmed ran %d times", n)
	}
	if err := lock.Commit(bd.ctx); err != nil {
		t.Fatal(err)
	}
	bd.eventually(30*time.Second, "the waiting task released", bd.statusIs(waiting, task.Retrying))
	// The running task's outcome may commit after the release (another
	// flusher): await it, so the second worker cannot take it over.
	bd.eventually(30*time.Second, "the running task SUCCEEDED", bd.statusIs(a.first, task.Succeeded))
	skip.Store(false)
	// Its entry is claimable at once, by a reclaimer.
	// Two slots: the stand-in reclaimer (bd.reclaim) needs one beside the
	// one the blocking read holds.
	const idle = 200 * time.Millisecond
	w2, _ := bd.worker(ingest.Config{Concurrency: 2, ReclaimIdle: idle}, map[string]ingest.Handler{"k": h.handle})
	bd.run(w2)
	bd.reclaim(w2, idle)
	h.runs.succeededOnce(bd, a.ids)
	if got, want := bd.path(waiting), "QUEUED→RUNNING→RETRYING→RUNNING→SUCCEEDED"; got != want {
		t.Errorf("the task whose lease could not be confirmed: audit %s, want %s", got, want)
	}
	if m := bd.transitions(waiting)[2].Message; m != task.ReleasedUnrun {
		t.Errorf("its release says %q, want %q", m, task.ReleasedUnrun)
	}
	if tk := bd.task(waiting); tk.AttemptCount != 0 {
		t.Errorf("attempt_count %d, want 0 (a release counts no failure)", tk.AttemptCount)
	}
}

// TestLimitedKindNotStartedAhead: a task of a limited kind is not started
// ahead of the handler slots; its message waits, delivered but unstarted,
// until a slot frees, and then it runs.
func TestLimitedKindNotStartedAhead(t *testing.T) {
	t.Parallel()
	a := startAhead(t, ingest.Config{}, "lim", 3, func(bd *bundle, _ *ingest.Worker) {
		many := 100 // a limit that never binds here
		if _, err := bd.store.SetKind(bd.ctx, "test", "lim", task.KindUpdate{Concurrency: &many}); err != nil {
			t.Fatal(err)
		}
	})
	bd := a.bd
	bd.eventually(30*time.Second, "all three entries delivered to the worker", func() bool { return bd.pending() == 3 })
	if n := bd.countStatus(task.Running); n != 1 {
		t.Errorf("%d tasks of a limited kind RUNNING with one busy slot, want 1", n)
	}
	for _, id := range a.others() {
		if s := bd.task(id).Status; s != task.Queued {
			t.Errorf("a waiting task of a limited kind is %s, want QUEUED", s)
		}
	}
	a.runOneAtATime(t)
}
