package ingest_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// createEntry creates nt and adds its entry to the stream.
func (bd *bundle) createEntry(nt task.NewTask) uuid.UUID {
	bd.t.Helper()
	r, err := bd.store.Create(bd.ctx, nt)
	if err != nil {
		bd.t.Fatal(err)
	}
	bd.add(stream.Entry{TaskID: r.Task.ID, Kind: nt.Kind})
	return r.Task.ID
}

// TestTimeoutPrecedence: a run's deadline is the task's timeout_ms, else
// its kind's HandlerOptions.Timeout, else the worker's TaskTimeout, and
// none when all are 0.
func TestTimeoutPrecedence(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	var mu sync.Mutex
	left := map[uuid.UUID]time.Duration{} // deadline − start; -1: none
	record := func(ctx context.Context, tk ingest.Task) error {
		d := time.Duration(-1)
		if dl, ok := ctx.Deadline(); ok {
			d = time.Until(dl)
		}
		mu.Lock()
		left[tk.ID] = d
		mu.Unlock()
		return nil
	}
	for _, workerTimeout := range []time.Duration{0, 40 * time.Second} {
		clear(left)
		w, _ := bd.worker(ingest.Config{TaskTimeout: workerTimeout}, map[string]ingest.Handler{"plain": record})
		w.HandleWith("kinded", record, ingest.HandlerOptions{Timeout: 20 * time.Second})
		stop := bd.run(w)
		own := bd.createEntry(task.NewTask{Kind: "kinded", Payload: json.RawMessage(`1`), Timeout: 10 * time.Second})
		kinded := bd.createEntry(task.NewTask{Kind: "kinded", Payload: json.RawMessage(`2`)})
		plain := bd.createEntry(task.NewTask{Kind: "plain", Payload: json.RawMessage(`3`)})
		bd.eventually(10*time.Second, "three runs", func() bool { mu.Lock(); defer mu.Unlock(); return len(left) == 3 })
		stop()
		mu.Lock()
		want := map[uuid.UUID]time.Duration{own: 10 * time.Second, kinded: 20 * time.Second, plain: workerTimeout}
		for id, w := range want {
			got := left[id]
			if w == 0 {
				if got != -1 {
					t.Errorf("worker timeout 0, task %s: deadline in %s, want none", id, got)
				}
				continue
			}
			if got > w || got < w-5*time.Second {
				t.Errorf("worker timeout %s, task %s: deadline in %s, want about %s", workerTimeout, id, got, w)
			}
		}
		mu.Unlock()
	}
}

// TestTimedOutAttemptFails: a run past its timeout is a failed attempt
// whose last_error says timeout; with attempts left it is retried, then it
// goes DEAD like any other failure.
func TestTimedOutAttemptFails(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{Backoff: task.Backoff{Base: 10 * time.Millisecond, Max: 10 * time.Millisecond}})
	var runs atomic.Int32
	w, _ := bd.worker(ingest.Config{ReclaimIdle: 200 * time.Millisecond, TaskLease: 300 * time.Millisecond}, map[string]ingest.Handler{
		"slow": func(ctx context.Context, _ ingest.Task) error {
			runs.Add(1)
			<-ctx.Done()
			return ctx.Err()
		},
	})
	bd.run(w)
	bd.reclaim(w, 200*time.Millisecond)
	id := bd.createEntry(task.NewTask{Kind: "slow", Payload: json.RawMessage(`1`), Timeout: 100 * time.Millisecond, MaxAttempts: 2})
	bd.eventually(20*time.Second, "DEAD", bd.statusIs(id, task.Dead))
	tk := bd.task(id)
	if !strings.Contains(tk.LastError, "timeout") || tk.AttemptCount != 2 || runs.Load() != 2 {
		t.Fatalf("task after two timed-out runs: last_error %q, attempts %d, runs %d; want a timeout, 2, 2", tk.LastError, tk.AttemptCount, runs.Load())
	}
	if want, got := "QUEUED→RUNNING→RETRYING→RUNNING→DEAD", bd.path(id); got != want {
		t.Errorf("transitions %s, want %s", got, want)
	}
}

// TestHandlerIgnoringTimeoutLosesItsTask: a handler that ignores its
// context keeps running, but once its timeout plus a lease has passed its
// worker stops renewing the lease, and another worker takes the task over
// after the lease expires.
func TestHandlerIgnoringTimeoutLosesItsTask(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	release := make(chan struct{})
	var stuck, ran atomic.Int32
	const lease, idle = 300 * time.Millisecond, 400 * time.Millisecond
	cfg := ingest.Config{TaskLease: lease, ReclaimIdle: idle, ShutdownTimeout: 100 * time.Millisecond}
	w1, _ := bd.worker(cfg, map[string]ingest.Handler{"hang": func(ctx context.Context, _ ingest.Task) error {
		stuck.Add(1)
		<-release // ignores ctx
		return nil
	}})
	bd.run(w1)
	t.Cleanup(func() { close(release) }) // before w1 stops (cleanups run last-in first-out)
	id := bd.createEntry(task.NewTask{Kind: "hang", Payload: json.RawMessage(`1`), Timeout: 200 * time.Millisecond, MaxAttempts: 3})
	bd.eventually(10*time.Second, "the stuck run started", func() bool { return stuck.Load() == 1 })
	started := time.Now()

	w2, _ := bd.worker(cfg, map[string]ingest.Handler{"hang": func(ctx context.Context, _ ingest.Task) error {
		ran.Add(1)
		return nil
	}})
	bd.run(w2)
	bd.reclaim(w2, idle)
	bd.eventually(20*time.Second, "the task taken over and SUCCEEDED", bd.statusIs(id, task.Succeeded))
	if took := time.Since(started); took < 200*time.Millisecond+lease {
		t.Errorf("taken over %s after the start, before timeout + lease (%s)", took, 200*time.Millisecond+lease)
	}
	tk := bd.task(id)
	if ran.Load() != 1 || tk.AttemptCount != 1 {
		t.Errorf("second worker ran %d times, attempt_count %d; want 1 and 1 (the abandoned run counted)", ran.Load(), tk.AttemptCount)
	}
	if n := bd.logs.count("handler ignores its timeout"); n != 1 {
		t.Errorf("%d log lines about the ignored timeout, want 1", n)
	}
}

// TestHandlerIgnoringTimeoutTakenOverWithDefaultReclaimIdle: with the
// default reclaim idle time (10 minutes), another worker takes over the
// task of a handler that ignores its timeout about a lease after its
// worker gave the run up, not after the reclaim idle time. That worker is
// heard from (the heartbeat of its other running task), so it is not
// silent: it hands the run's entry to its abandoned consumer
// (stream.AbandonedConsumer), which is, and whose entries of expired
// leases other workers' reclaimers take over; its own reclaimer leaves the
// task of its own lease alone.
func TestHandlerIgnoringTimeoutTakenOverWithDefaultReclaimIdle(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	release := make(chan struct{})
	var stuck, ran atomic.Int32
	const lease, timeout = 500 * time.Millisecond, 200 * time.Millisecond
	cfg := ingest.Config{TaskLease: lease, ShutdownTimeout: 100 * time.Millisecond}
	if d := cfg.WithDefaults(); d.ReclaimIdle != 10*time.Minute {
		t.Fatalf("default reclaim idle %s: the test assumes 10 minutes", d.ReclaimIdle)
	}
	var busy atomic.Int32
	w1, _ := bd.worker(cfg, map[string]ingest.Handler{"hang": func(ctx context.Context, _ ingest.Task) error {
		stuck.Add(1)
		<-release // ignores ctx
		return nil
	}, "busy": func(ctx context.Context, _ ingest.Task) error {
		busy.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}})
	bd.run(w1)
	bd.reclaimer(w1)
	t.Cleanup(func() { close(release) }) // before w1 stops (cleanups run last-in first-out)
	// A task that runs on w1 all along: its heartbeat keeps w1 heard from.
	bd.createEntry(task.NewTask{Kind: "busy", Payload: json.RawMessage(`1`)})
	bd.eventually(10*time.Second, "the busy run started", func() bool { return busy.Load() == 1 })
	id := bd.createEntry(task.NewTask{Kind: "hang", Payload: json.RawMessage(`1`), Timeout: timeout, MaxAttempts: 3})
	bd.eventually(10*time.Second, "the stuck run started", func() bool { return stuck.Load() == 1 })
	started := time.Now()

	w2, _ := bd.worker(cfg, map[string]ingest.Handler{"hang": func(ctx context.Context, _ ingest.Task) error {
		ran.Add(1)
		return nil
	}})
	bd.run(w2)
	bd.reclaimer(w2)
	// Timeout + lease (abandoned) + lease (expired) + a round: about 1.3 s.
	bd.eventually(30*time.Second, "the task taken over and SUCCEEDED", bd.statusIs(id, task.Succeeded))
	tk := bd.task(id)
	if ran.Load() != 1 || tk.AttemptCount != 1 {
		t.Errorf("second worker ran %d times, attempt_count %d; want 1 and 1 (the abandoned run counted)", ran.Load(), tk.AttemptCount)
	}
	t.Logf("taken over and SUCCEEDED %s after the stuck run started (timeout %s, lease %s, reclaim idle 10m)",
		time.Since(started).Round(10*time.Millisecond), timeout, lease)
}

// reclaimer runs a reclaimer (package reclaim) feeding w, with rounds every
// 100 ms and otherwise w's settings, until the test ends.
func (bd *bundle) reclaimer(w *ingest.Worker) {
	bd.t.Helper()
	cfg := w.Config().Reclaim // the worker's stream, consumer, idle time and lease
	cfg.Interval = 100 * time.Millisecond
	r, err := reclaim.New(cfg, bd.rdb, bd.db, w.Sink(), slog.New(bd.logs), nil)
	if err != nil {
		bd.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	bd.t.Cleanup(func() { cancel(); <-done })
}
