package ingest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// realRedis is the test redis-server as a backend (cancellation and
// timeouts need no second Redis backend).
func realRedis(t *testing.T) testenv.Backend {
	url := testenv.RedisURL(t)
	return testenv.Backend{Name: "redis", URL: url, Client: testenv.Client(t, url)}
}

// blocker is a handler that reports each run's start and, once its context
// ends, the moment and the cause.
type blocker struct {
	name    string
	started chan uuid.UUID
	ended   chan ended
}

type ended struct {
	id     uuid.UUID
	worker string
	at     time.Time
	cause  error
}

func newBlocker(name string, started chan uuid.UUID, done chan ended) *blocker {
	return &blocker{name: name, started: started, ended: done}
}

func (b *blocker) handle(ctx context.Context, t ingest.Task) error {
	b.started <- t.ID
	<-ctx.Done()
	b.ended <- ended{id: t.ID, worker: b.name, at: time.Now(), cause: context.Cause(ctx)}
	return ctx.Err()
}

// listeners counts the sessions of this test's database listening for
// cancel requests.
func (bd *bundle) listeners() int {
	var n int
	if err := bd.db.QueryRow(bd.ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'ingest-cancel-listener' AND query LIKE 'LISTEN%'`).Scan(&n); err != nil {
		bd.t.Fatal(err)
	}
	return n
}

// wantCancelled checks the end state of a cancelled task: CANCELLED with
// the actor's audit row, its entry acknowledged, no DLQ entry.
func (bd *bundle) wantCancelled(id uuid.UUID) {
	bd.t.Helper()
	bd.eventually(30*time.Second, "task CANCELLED", bd.statusIs(id, task.Cancelled))
	recs := bd.transitions(id)
	last := recs[len(recs)-1]
	if last.From != string(task.Running) || last.To != string(task.Cancelled) || last.Worker != "api:test" || last.Message != "cancelled: enough" {
		bd.t.Fatalf("last audit row %+v; want RUNNING -> CANCELLED by api:test, 'cancelled: enough' (path %s)", last, bd.path(id))
	}
	bd.eventually(30*time.Second, "entry acknowledged", func() bool { return bd.pending() == 0 })
	if n := len(bd.dlqEntries()); n != 0 {
		bd.t.Fatalf("%d DLQ entries for a cancelled task, want none", n)
	}
}

// TestCancelRunningTaskOnAnotherWorker: the cancel is made through a store
// of its own (as by the API of another process); whichever of two workers
// runs the task hears the NOTIFY and cancels its handler's context with
// ErrCancelled within a second; the task ends CANCELLED, its entry acked,
// nothing in the DLQ. It reports the latency from the cancel call to the
// handler's context ending.
func TestCancelRunningTaskOnAnotherWorker(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	started, done := make(chan uuid.UUID, 1), make(chan ended, 1)
	for _, name := range []string{"wa", "wb"} {
		w, _ := bd.worker(ingest.Config{Consumer: name, TaskLease: 30 * time.Second}, map[string]ingest.Handler{
			"slow": newBlocker(name, started, done).handle,
		})
		bd.run(w)
	}
	bd.eventually(10*time.Second, "both workers listening for cancels", func() bool { return bd.listeners() == 2 })
	// The canceller: another pool, another store.
	pool, err := pgxpool.New(bd.ctx, bd.db.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	other, err := task.NewStore(bd.store.Config(), pool)
	if err != nil {
		t.Fatal(err)
	}
	const runs = 20
	var lat []time.Duration
	ranOn := map[string]int{}
	for i := range runs {
		id := bd.enqueue("slow", 1, 3)[0]
		if got := <-started; got != id {
			t.Fatalf("run %d: started %s, want %s", i, got, id)
		}
		t0 := time.Now()
		r, err := other.Cancel(bd.ctx, "api:test", "enough", id)
		if err != nil || r.Outcome != task.CancelRequested {
			t.Fatalf("run %d: Cancel = %+v, %v", i, r, err)
		}
		var e ended
		// The NOTIFY takes milliseconds; without it, the next lease
		// renewal would take 10 s (a third of the lease).
		select {
		case e = <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("run %d: handler context not cancelled within 5 s of the cancel (the renewal is 10 s away)", i)
		}
		if e.id != id || !errors.Is(e.cause, ingest.ErrCancelled) {
			t.Fatalf("run %d: handler of %s ended with cause %v, want ErrCancelled", i, e.id, e.cause)
		}
		lat = append(lat, e.at.Sub(t0))
		ranOn[e.worker]++
		bd.wantCancelled(id)
	}
	slices.Sort(lat)
	t.Logf("cancel latency over %d runs (call → handler context cancelled): p50 %s, max %s; runs per worker %v",
		runs, lat[len(lat)/2], lat[len(lat)-1], ranOn)
}

// TestCancelAtLeaseRenewal: a worker that does not LISTEN (missed the
// NOTIFY) cancels the handler at its next lease renewal.
func TestCancelAtLeaseRenewal(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	started, done := make(chan uuid.UUID, 1), make(chan ended, 1)
	const lease = 900 * time.Millisecond
	w, reg := bd.worker(ingest.Config{TaskLease: lease, CancelListenDisabled: true}, map[string]ingest.Handler{
		"slow": newBlocker("w", started, done).handle,
	})
	bd.run(w)
	id := bd.enqueue("slow", 1, 3)[0]
	<-started
	t0 := time.Now()
	if r, err := bd.store.Cancel(bd.ctx, "api:test", "enough", id); err != nil || r.Outcome != task.CancelRequested {
		t.Fatalf("Cancel = %+v, %v", r, err)
	}
	var e ended
	// Nothing but the renewal can cancel it (the worker does not listen,
	// and the handler blocks until cancelled).
	select {
	case e = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("handler context not cancelled at the lease renewal")
	}
	if !errors.Is(e.cause, ingest.ErrCancelled) {
		t.Fatalf("cause %v, want ErrCancelled", e.cause)
	}
	t.Logf("cancelled %s after the call; the heartbeat beats every %s", e.at.Sub(t0), lease/3)
	if bd.listeners() != 0 {
		t.Fatal("a worker with CancelListenDisabled listens")
	}
	bd.wantCancelled(id)
	bd.eventually(30*time.Second, "cancelled counted", func() bool {
		return metric(t, reg, "ingest_task_process_total", result("cancelled")) == 1
	})
}

// TestCancelCompletionWinsOrLoses: a handler that ignores its context and
// returns nil after a cancel request still ends CANCELLED (the request
// committed first); a cancel after the success committed is refused.
func TestCancelCompletionWinsOrLoses(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	started := make(chan uuid.UUID, 1)
	release := make(chan struct{})
	w, _ := bd.worker(ingest.Config{}, map[string]ingest.Handler{
		"stubborn": func(ctx context.Context, t ingest.Task) error {
			started <- t.ID
			<-release
			return nil
		},
	})
	bd.run(w)

	id := bd.enqueue("stubborn", 1, 3)[0]
	<-started
	if r, err := bd.store.Cancel(bd.ctx, "api:test", "enough", id); err != nil || r.Outcome != task.CancelRequested {
		t.Fatalf("Cancel = %+v, %v", r, err)
	}
	release <- struct{}{}
	bd.wantCancelled(id)

	id2 := bd.enqueue("stubborn", 1, 3)[0]
	<-started
	release <- struct{}{}
	bd.eventually(30*time.Second, "task SUCCEEDED", bd.statusIs(id2, task.Succeeded))
	if r, err := bd.store.Cancel(bd.ctx, "api:test", "late", id2); err != nil || r.Outcome != task.CancelRefused || r.Task.Status != task.Succeeded {
		t.Fatalf("Cancel after success = %+v, %v; want refused", r, err)
	}
}

// TestCancelledRedeliveryAcked: an entry of a task cancelled while it
// waited is acknowledged when delivered (terminal: the start skips it), and
// a redrive runs the task again.
func TestCancelledRedeliveryAcked(t *testing.T) {
	t.Parallel()
	bd := setup(t, realRedis(t), task.Config{})
	var mu sync.Mutex
	var ran []uuid.UUID
	w, reg := bd.worker(ingest.Config{}, map[string]ingest.Handler{
		"k": func(ctx context.Context, t ingest.Task) error {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, t.ID)
			return nil
		},
	})
	res, err := bd.store.Create(bd.ctx, task.NewTask{Kind: "k", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Task.ID
	if r, err := bd.store.Cancel(bd.ctx, "api:test", "", id); err != nil || r.Outcome != task.CancelDone {
		t.Fatalf("Cancel of a queued task = %+v, %v", r, err)
	}
	bd.add(onceEntry(id))
	bd.add(onceEntry(id))
	bd.run(w)
	bd.eventually(30*time.Second, "both entries skipped", func() bool {
		return metric(t, reg, "ingest_task_process_total", result("skipped")) == 2
	})
	if bd.pending() != 0 || len(bd.dlqEntries()) != 0 {
		t.Fatalf("pending %d, DLQ %d; want both 0", bd.pending(), len(bd.dlqEntries()))
	}
	mu.Lock()
	if len(ran) != 0 {
		t.Fatalf("a cancelled task ran: %v", ran)
	}
	mu.Unlock()
	if rs, err := bd.store.Redrive(bd.ctx, "cli:test", id); err != nil || !rs[0].Applied {
		t.Fatalf("Redrive = %+v, %v", rs, err)
	}
	bd.add(onceEntry(id)) // as the relay would publish the redrive's outbox row
	bd.eventually(30*time.Second, "redriven task SUCCEEDED", bd.statusIs(id, task.Succeeded))
	if p := bd.path(id); p != "QUEUED→CANCELLED→QUEUED→RUNNING→SUCCEEDED" {
		t.Fatalf("path %s", p)
	}
}
