package reclaim_test

// End-to-end tests: a real ingest.Service (its worker fed by its Reclaimer), on real
// PostgreSQL and a real redis-server.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

const group = "ingest-workers"

// env is one test's servers and keys.
type env struct {
	db       *testenv.Database
	rdb      *redis.Client
	redisURL string
	stream   string
	dlq      string
	store    *task.Store
}

func newEnv(t *testing.T, cfg task.Config) *env {
	t.Helper()
	e := &env{db: testenv.NewDatabase(t), redisURL: testenv.RedisURL(t)}
	e.rdb = testenv.Client(t, e.redisURL)
	e.stream, e.dlq = testenv.Keys(t)
	cfg.Stream = e.stream
	var err error
	if e.store, err = task.NewStore(cfg, e.db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XGroupCreateMkStream(context.Background(), e.stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) pool() *pgxpool.Pool { return e.db.Pool }

// create creates tasks of kind with payloads {"i": n}.
func (e *env) create(t *testing.T, kind string, n, maxAttempts int) []uuid.UUID {
	t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), MaxAttempts: maxAttempts}
	}
	res, err := e.store.CreateBatch(context.Background(), nts)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, n)
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	return ids
}

// statusCount returns how many tasks are in status.
func (e *env) statusCount(t *testing.T, status task.State) int {
	t.Helper()
	var n int
	if err := e.pool().QueryRow(context.Background(), `SELECT count(*) FROM ingest_task WHERE status = $1`, string(status)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// readAsCrashed reads up to n new entries as consumer "crashed" and never
// acks them; with lease > 0 it also starts their tasks under that lease, as
// a worker does right before it dies.
func (e *env) readAsCrashed(t *testing.T, n int, lease time.Duration) []redis.XMessage {
	t.Helper()
	ctx := context.Background()
	res, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "crashed",
		Streams: []string{e.stream, ">"}, Count: int64(n), Block: -1}).Result()
	if err != nil || len(res) != 1 || len(res[0].Messages) != n {
		t.Fatalf("XREADGROUP as crashed: %v, %v", res, err)
	}
	msgs := res[0].Messages
	if lease > 0 {
		ids := make([]uuid.UUID, len(msgs))
		for i, m := range msgs {
			ids[i] = uuid.MustParse(m.Values["task_id"].(string))
		}
		if _, err := e.store.Start(ctx, "crashed", lease, ids...); err != nil {
			t.Fatal(err)
		}
	}
	return msgs
}

// workerOpts configures one in-process worker with its reclaimer.
type workerOpts struct {
	name        string
	concurrency int
	lease       time.Duration // task lease; the heartbeat runs every lease/3
	minIdle     time.Duration // reclaim idle time (0: the default 10 min)
	interval    time.Duration // reclaim interval
	block       time.Duration // a blocking read's wait (0: 100ms)
	handlers    map[string]ingest.Handler
	relay       bool // also run an outbox relay
}

// running is a started worker.
type running struct {
	svc  *ingest.Service
	reg  *prometheus.Registry
	stop func()
}

func startWorker(t *testing.T, e *env, o workerOpts) *running {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := prometheus.NewRegistry()
	svc, err := ingest.NewService(ingest.Config{
		Stream: e.stream, Group: group, DLQ: e.dlq, Consumer: o.name,
		Concurrency: o.concurrency, TaskLease: o.lease, ReclaimIdle: o.minIdle,
		Block: cmp.Or(o.block, 100*time.Millisecond), ShutdownTimeout: 2 * time.Second,
		Store:         e.store.Config(),
		Reclaim:       reclaim.Config{Interval: o.interval},
		Relay:         outbox.RelayConfig{PublishInterval: 50 * time.Millisecond},
		RelayDisabled: !o.relay,
		// The worker and its reclaimer only: no leader's services.
		Maintenance: maintenance.Config{RescuerDisabled: true, RetentionDisabled: true, ConsumersDisabled: true, ReleaserDisabled: true},
	}, e.pool(), ingest.Redis(e.rdb), logger, reg)
	if err != nil {
		t.Fatalf("ingest.NewService: %v", err)
	}
	for kind, h := range o.handlers {
		svc.Handle(kind, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := svc.Run(ctx); err != nil {
			t.Errorf("service: %v", err)
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return &running{svc: svc, reg: reg, stop: stop}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func reclaimCounter(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ingest_stream_reclaim_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("ingest_stream_reclaim_total{result=%q} not registered", result)
	return 0
}

func pendingCount(t *testing.T, e *env) int64 {
	t.Helper()
	p, err := e.rdb.XPending(context.Background(), e.stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// TestE2ERetryTiming: a task failing twice runs again when each retry
// falls due (within the reclaim interval plus 10 s: milliseconds on a
// quiet machine), not after the crash-detection idle time of 10 minutes.
func TestE2ERetryTiming(t *testing.T) {
	t.Parallel()
	const (
		base     = 200 * time.Millisecond
		interval = 100 * time.Millisecond
	)
	e := newEnv(t, task.Config{Backoff: task.Backoff{Base: base, Max: time.Minute, Jitter: 0}})
	var mu sync.Mutex
	var attempts []time.Time
	startWorker(t, e, workerOpts{
		name: "w1", concurrency: 4, lease: 3 * time.Second, minIdle: reclaim.DefaultMinIdle, interval: interval, relay: true,
		handlers: map[string]ingest.Handler{"flaky": func(ctx context.Context, tk ingest.Task) error {
			mu.Lock()
			attempts = append(attempts, time.Now())
			mu.Unlock()
			if tk.Attempt < 3 {
				return fmt.Errorf("failure %d", tk.Attempt)
			}
			return nil
		}},
	})
	created := time.Now()
	id := e.create(t, "flaky", 1, 5)[0]
	testenv.Eventually(t, 10*time.Second, "the task to succeed", func() bool { return e.statusCount(t, task.Succeeded) == 1 })
	took := time.Since(created)

	tk, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if tk.AttemptCount != 2 {
		t.Fatalf("attempt_count %d, want 2 failures", tk.AttemptCount)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 3 {
		t.Fatalf("handler ran %d times, want 3", len(attempts))
	}
	t.Logf("task succeeded %s after creation", took)
	for i := 1; i < len(attempts); i++ {
		backoff := base << (i - 1) // 200ms, then 400ms
		gap := attempts[i].Sub(attempts[i-1])
		t.Logf("attempt %d → %d: gap %s, backoff %s, late by %s", i, i+1, gap.Round(time.Millisecond), backoff, (gap - backoff).Round(time.Millisecond))
		if gap < backoff {
			t.Errorf("attempt %d ran %s after attempt %d, before its backoff %s", i+1, gap, i, backoff)
		}
		// Milliseconds more; 10 s tells a stuck retry from a slow machine.
		if limit := backoff + interval + 10*time.Second; gap > limit {
			t.Errorf("attempt %d ran %s after attempt %d, later than backoff + interval + 10s = %s", i+1, gap, i, limit)
		}
	}
}

// TestE2ECrashedConsumerEntriesComplete: a consumer reads 20 entries,
// starts their tasks and dies without acking; a second worker claims them
// and completes them, none before its lease expired (the takeover of a
// consumer silent for a lease, or the claim after the idle time, whichever
// its free slots reach first); the audit shows each abandoned run as a
// failed attempt.
func TestE2ECrashedConsumerEntriesComplete(t *testing.T) {
	t.Parallel()
	const (
		minIdle = 500 * time.Millisecond
		lease   = 300 * time.Millisecond // the crashed consumer's
	)
	e := newEnv(t, task.Config{})
	ids := e.create(t, "work", 20, 5)
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)
	crashed := time.Now() // before the starts: every lease ends at least lease after it
	e.readAsCrashed(t, 20, lease)

	var runs sync.Map
	startWorker(t, e, workerOpts{
		name: "survivor", concurrency: 8, lease: 300 * time.Millisecond, minIdle: minIdle, interval: 100 * time.Millisecond,
		handlers: map[string]ingest.Handler{"work": func(ctx context.Context, tk ingest.Task) error {
			if _, dup := runs.LoadOrStore(tk.ID, tk.Attempt); dup {
				t.Errorf("task %s ran twice", tk.ID)
			}
			return nil
		}},
	})
	testenv.Eventually(t, 20*time.Second, "20 tasks to succeed", func() bool { return e.statusCount(t, task.Succeeded) == 20 })
	recovered := time.Since(crashed)
	t.Logf("crash recovery: all 20 tasks succeeded %s after the crash (lease %s, min idle %s)", recovered.Round(time.Millisecond), lease, minIdle)
	if recovered < lease {
		t.Errorf("recovered after %s, before the crashed consumer's leases (%s) expired: entries were taken from a live-looking consumer", recovered, lease)
	}

	for _, id := range ids {
		tk, recs, err := e.store.GetWithTransitions(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if tk.AttemptCount != 1 {
			t.Errorf("task %s: attempt_count %d, want 1 (the abandoned run)", id, tk.AttemptCount)
		}
		var trail []string
		abandoned := false
		for _, r := range recs {
			trail = append(trail, fmt.Sprintf("%s→%s(%d,%s)", r.From, r.To, r.AttemptCount, r.Worker))
			if r.From == "RUNNING" && r.To == "RUNNING" && r.Worker == "survivor" && strings.Contains(r.Message, "crashed") && r.AttemptCount == 1 {
				abandoned = true
			}
		}
		if !abandoned || recs[len(recs)-1].To != "SUCCEEDED" {
			t.Errorf("task %s: audit %v, want the abandoned run of crashed taken over by survivor, then SUCCEEDED", id, trail)
		}
		if a, _ := runs.Load(id); a != 2 {
			t.Errorf("task %s ran as attempt %v, want 2", id, a)
		}
	}
	testenv.Eventually(t, 5*time.Second, "the entries to be acked", func() bool { return pendingCount(t, e) == 0 })
}

// TestE2EOneSlotWorkerReclaimsWhileIdle: a worker of one slot whose
// stream is idle, its consumer's blocking read holding that slot for 2 s
// at a time, still claims a dead consumer's entries: its reclaim round
// waits for the slot and takes it when the read returns. Each task runs
// once.
func TestE2EOneSlotWorkerReclaimsWhileIdle(t *testing.T) {
	t.Parallel()
	const minIdle = 300 * time.Millisecond
	e := newEnv(t, task.Config{})
	ids := e.create(t, "work", 3, 5)
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)
	e.readAsCrashed(t, 3, 0)
	var runs sync.Map
	startWorker(t, e, workerOpts{
		name: "survivor", concurrency: 1, lease: 3 * time.Second, minIdle: minIdle, interval: 100 * time.Millisecond,
		block: 2 * time.Second,
		handlers: map[string]ingest.Handler{"work": func(ctx context.Context, tk ingest.Task) error {
			if _, dup := runs.LoadOrStore(tk.ID, true); dup {
				t.Errorf("task %s ran twice", tk.ID)
			}
			return nil
		}},
	})
	testenv.Eventually(t, 60*time.Second, "the dead consumer's 3 tasks to succeed", func() bool { return e.statusCount(t, task.Succeeded) == 3 })
	for _, id := range ids {
		if _, ok := runs.Load(id); !ok {
			t.Errorf("task %s succeeded without a run here", id)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the entries to be acked", func() bool { return pendingCount(t, e) == 0 })
}

// TestE2ERoundDrainsABacklog: a dead consumer's 300 entries, all claimable
// at once, are claimed by a worker of 4 handler slots in its first reclaim
// round, as its slots come free, rather than a round's free slots each
// reclaim interval (here a minute, so the next round comes after the
// test's deadline). Each task runs once.
func TestE2ERoundDrainsABacklog(t *testing.T) {
	t.Parallel()
	const n = 300
	e := newEnv(t, task.Config{})
	ids := e.create(t, "work", n, 5)
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)
	msgs := e.readAsCrashed(t, n, 0)
	// Idle for a minute already: claimable by the first round.
	args := []any{"XCLAIM", e.stream, group, "crashed", 0}
	for _, m := range msgs {
		args = append(args, m.ID)
	}
	if err := e.rdb.Do(context.Background(), append(args, "IDLE", time.Minute.Milliseconds(), "JUSTID")...).Err(); err != nil {
		t.Fatal(err)
	}
	var runs sync.Map
	began := time.Now()
	startWorker(t, e, workerOpts{
		name: "survivor", concurrency: 4, lease: 3 * time.Second, minIdle: 300 * time.Millisecond, interval: time.Minute,
		handlers: map[string]ingest.Handler{"work": func(ctx context.Context, tk ingest.Task) error {
			if _, dup := runs.LoadOrStore(tk.ID, true); dup {
				t.Errorf("task %s ran twice", tk.ID)
			}
			return nil
		}},
	})
	testenv.Eventually(t, 30*time.Second, "the dead consumer's tasks to succeed in the first round", func() bool {
		return e.statusCount(t, task.Succeeded) == n
	})
	t.Logf("%d entries claimed and run in %s", n, time.Since(began).Round(time.Millisecond))
	for _, id := range ids {
		if _, ok := runs.Load(id); !ok {
			t.Errorf("task %s succeeded without a run here", id)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the entries to be acked", func() bool { return pendingCount(t, e) == 0 })
}

// TestE2ELongTaskIsNotReclaimed: a handler running 5× the reclaim idle time
// keeps its entry fresh (heartbeat): a second worker's reclaimer polling
// every 100 ms never claims it; it runs once and its delivery count stays 1.
// Real Redis only: miniredis counts a delivery for the heartbeat's XCLAIM
// JUSTID.
func TestE2ELongTaskIsNotReclaimed(t *testing.T) {
	t.Parallel()
	const minIdle = 500 * time.Millisecond
	e := newEnv(t, task.Config{})
	var runs sync.Map // task id → count
	started := make(chan struct{}, 1)
	handler := func(ctx context.Context, tk ingest.Task) error {
		n, _ := runs.LoadOrStore(tk.ID, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		select {
		case started <- struct{}{}:
		default:
		}
		select { // the work of this task takes 5× the idle time
		case <-time.After(5 * minIdle):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	opts := workerOpts{concurrency: 2, lease: 300 * time.Millisecond, minIdle: minIdle, interval: 100 * time.Millisecond,
		handlers: map[string]ingest.Handler{"long": handler}}
	a := opts
	a.name = "runner"
	startWorker(t, e, a)
	id := e.create(t, "long", 1, 5)[0]
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)
	<-started
	b := opts
	b.name = "poller"
	second := startWorker(t, e, b)

	// While it runs, the entry stays with the runner, delivered once.
	for e.statusCount(t, task.Succeeded) == 0 {
		p, err := e.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: e.stream, Group: group, Start: "-", End: "+", Count: 10}).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, pe := range p {
			if pe.Consumer != "runner" || pe.RetryCount != 1 {
				t.Fatalf("pending entry %s: consumer %s, delivery count %d; want runner, 1", pe.ID, pe.Consumer, pe.RetryCount)
			}
		}
		time.Sleep(20 * time.Millisecond) // sampling period, not synchronisation
	}
	n, _ := runs.Load(id)
	if got := n.(*atomic.Int32).Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	if v := reclaimCounter(t, second.reg, "claimed"); v != 0 {
		t.Errorf("the polling reclaimer claimed %v entries, want 0", v)
	}
	tk, err := e.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if tk.AttemptCount != 0 {
		t.Errorf("attempt_count %d, want 0", tk.AttemptCount)
	}
}

// TestE2ETrimmedPendingEntriesSucceed: 100 entries read and not acked, the
// stream trimmed to 10: the reclaimer reports the 90 deleted ids,
// republishes their tasks through the outbox, and all 100 tasks succeed.
func TestE2ETrimmedPendingEntriesSucceed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, task.Config{})
	e.create(t, "work", 100, 5)
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)
	e.readAsCrashed(t, 100, 0)
	if err := e.rdb.XTrimMaxLen(context.Background(), e.stream, 10).Err(); err != nil {
		t.Fatal(err)
	}
	// The survivor's heartbeat refreshes the entries it holds every lease/3
	// (1 s); a min-idle of 2.5 s leaves a late heartbeat on a loaded
	// machine 1.5 s before its own reclaimer would claim one of them (and
	// count it).
	w := startWorker(t, e, workerOpts{
		name: "survivor", concurrency: 16, minIdle: 2500 * time.Millisecond, interval: 100 * time.Millisecond, relay: true, lease: 3 * time.Second,
		handlers: map[string]ingest.Handler{"work": func(context.Context, ingest.Task) error { return nil }},
	})
	testenv.Eventually(t, 40*time.Second, "100 tasks to succeed", func() bool { return e.statusCount(t, task.Succeeded) == 100 })
	if v := reclaimCounter(t, w.reg, "deleted"); v != 90 {
		t.Errorf("deleted counter %v, want 90", v)
	}
	if v := reclaimCounter(t, w.reg, "claimed"); v != 10 {
		t.Errorf("claimed counter %v, want 10", v)
	}
	testenv.Eventually(t, 5*time.Second, "the entries to be acked", func() bool { return pendingCount(t, e) == 0 })
}

// TestE2EDeletedTaskLeavesNoEntry: deleting a finished task whose entry is
// still pending (here: cancelled while the entry was pending at a worker
// that then died) removes the entry from the group's pending entries and
// from the stream (dlq.Delete), so that the next reclaimer pass finds
// nothing of it to dead-letter as an entry of no task. A task cancelled
// alike but kept shows that the pass ran: its entry is claimed and
// acknowledged.
func TestE2EDeletedTaskLeavesNoEntry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, task.Config{})
	ids := e.create(t, "work", 2, 5)
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)
	entryOf := map[string]string{}
	for _, m := range e.readAsCrashed(t, 2, 0) {
		entryOf[m.Values["task_id"].(string)] = m.ID
	}
	for _, id := range ids {
		if r, err := e.store.Cancel(ctx, "test", "", id); err != nil || r.Outcome != task.CancelDone {
			t.Fatalf("cancel %s: %+v, %v", id, r, err)
		}
	}
	deleted, kept := ids[0], ids[1]
	res, _, err := dlq.Delete(ctx, e.rdb, e.dlq, e.store, deleted)
	if err != nil || len(res) != 1 || !res[0].Deleted {
		t.Fatalf("dlq.Delete = %+v, %v; want the task deleted", res, err)
	}
	ps, err := e.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: e.stream, Group: group, Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(ps) != 1 || ps[0].ID != entryOf[kept.String()] {
		t.Fatalf("pending after the delete: %v, %v; want only the kept task's entry %s", ps, err, entryOf[kept.String()])
	}
	msgs, err := e.rdb.XRange(ctx, e.stream, "-", "+").Result()
	if err != nil || len(msgs) != 1 || msgs[0].ID != entryOf[kept.String()] {
		t.Fatalf("stream after the delete: %v, %v; want only the kept task's entry", msgs, err)
	}

	w := startWorker(t, e, workerOpts{
		name: "survivor", concurrency: 4, lease: time.Second, minIdle: 300 * time.Millisecond, interval: 100 * time.Millisecond,
		handlers: map[string]ingest.Handler{"work": func(_ context.Context, tk ingest.Task) error {
			t.Errorf("cancelled task %s ran", tk.ID)
			return nil
		}},
	})
	testenv.Eventually(t, 20*time.Second, "the kept task's entry to be claimed and acknowledged", func() bool { return pendingCount(t, e) == 0 })
	if v := reclaimCounter(t, w.reg, "claimed"); v != 1 {
		t.Errorf("claimed counter %v, want 1 (the kept task's entry)", v)
	}
	if n, err := e.rdb.XLen(ctx, e.dlq).Result(); err != nil || n != 0 {
		t.Errorf("DLQ holds %d entries (%v), want none", n, err)
	}
}
