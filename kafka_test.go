package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// kbundle is what a Kafka-mode test works with: an in-process cluster, a
// database, a store publishing to the task topic and a relay.
type kbundle struct {
	t       *testing.T
	ctx     context.Context
	brokers []string
	db      *pgxpool.Pool
	store   *task.Store
	logs    *logRecorder
}

func ksetup(t *testing.T, partitions int32, storeCfg task.Config) *kbundle {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, kafka.DefaultTopic, kafka.DefaultDLQTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	db := testenv.DB(t)
	storeCfg.Stream = kafka.DefaultTopic
	store, err := task.NewStore(storeCfg, db)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecorder{}
	t.Cleanup(func() {
		if t.Failed() {
			logs.dump(t)
		}
	})
	return &kbundle{t: t, ctx: context.Background(), brokers: c.ListenAddrs(), db: db, store: store, logs: logs}
}

func (kb *kbundle) kcfg() kafka.Config {
	return kafka.Config{Brokers: kb.brokers, CommitInterval: 20 * time.Millisecond, RedeliverDelay: 200 * time.Millisecond}
}

// relay runs a relay publishing to the cluster until the test ends.
func (kb *kbundle) relay() {
	kb.t.Helper()
	cl, err := kafka.NewProducerClient(kb.kcfg())
	if err != nil {
		kb.t.Fatal(err)
	}
	r, err := outbox.NewRelayWith(outbox.RelayConfig{PublishInterval: 20 * time.Millisecond}, kb.db,
		kafka.NewPublisher(cl, 0), slog.New(kb.logs), nil)
	if err != nil {
		kb.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	kb.t.Cleanup(func() {
		cancel()
		<-done
		cl.Close()
	})
}

// worker returns a Kafka-mode worker with fast test timings.
func (kb *kbundle) worker(cfg ingest.Config, handlers map[string]ingest.Handler) (*ingest.Worker, *prometheus.Registry) {
	kb.t.Helper()
	if cfg.Consumer == "" {
		cfg.Consumer = "w-" + uuid.NewString()[:8]
	}
	if cfg.TaskLease == 0 {
		cfg.TaskLease = time.Second
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 2 * time.Second
	}
	reg := prometheus.NewRegistry()
	w, err := ingest.NewKafka(cfg, kb.kcfg(), kb.store, kb.db, slog.New(kb.logs).With("consumer", cfg.Consumer), reg)
	if err != nil {
		kb.t.Fatal(err)
	}
	for k, h := range handlers {
		w.Handle(k, h)
	}
	return w, reg
}

func (kb *kbundle) run(w *ingest.Worker) (stop func()) {
	bd := &bundle{t: kb.t}
	return bd.run(w)
}

func (kb *kbundle) enqueue(kind string, n, maxAttempts int) []uuid.UUID {
	kb.t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), MaxAttempts: maxAttempts}
	}
	res, err := kb.store.CreateBatch(kb.ctx, nts)
	if err != nil {
		kb.t.Fatal(err)
	}
	ids := make([]uuid.UUID, n)
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	return ids
}

func (kb *kbundle) task(id uuid.UUID) task.Task {
	kb.t.Helper()
	tk, err := kb.store.Get(kb.ctx, id)
	if err != nil {
		kb.t.Fatal(err)
	}
	return tk
}

func (kb *kbundle) countStatus(s task.State) int {
	kb.t.Helper()
	var n int
	if err := kb.db.QueryRow(kb.ctx, `SELECT count(*) FROM ingest_task WHERE status = $1`, s).Scan(&n); err != nil {
		kb.t.Fatal(err)
	}
	return n
}

func (kb *kbundle) transitions(id uuid.UUID) []transition.Record {
	kb.t.Helper()
	recs, err := transition.List(kb.ctx, kb.db, id)
	if err != nil {
		kb.t.Fatal(err)
	}
	return recs
}

// lag is the group's total lag on the task topic (-1: not known yet).
func (kb *kbundle) lag() int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kb.brokers...))
	if err != nil {
		kb.t.Fatal(err)
	}
	defer cl.Close()
	lags, err := kadm.NewClient(cl).Lag(kb.ctx, kafka.DefaultGroup)
	if err != nil || lags.Error() != nil {
		return -1
	}
	l, ok := lags[kafka.DefaultGroup]
	if !ok || l.FetchErr != nil {
		return -1
	}
	return l.Lag.Total()
}

// dlqRecords reads the DLQ topic from the start until it holds want
// records or 30 s have passed. A task is DEAD in the database before its
// record is produced; callers wait for the group's lag to reach 0 first
// (a record is committed only after its dead-letter was produced), so a
// short read is a lost record, not a slow one.
func (kb *kbundle) dlqRecords(want int) []*kgo.Record {
	kb.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kb.brokers...), kgo.ConsumeTopics(kafka.DefaultDLQTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		kb.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(kb.ctx, 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want && ctx.Err() == nil {
		out = append(out, cl.PollFetches(ctx).Records()...)
	}
	return out
}

func TestKafkaProcessTasks(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 4, task.Config{})
	var runs atomic.Int32
	w, reg := kb.worker(ingest.Config{}, map[string]ingest.Handler{
		"k": func(context.Context, ingest.Task) error { runs.Add(1); return nil },
	})
	kb.relay()
	kb.run(w)
	kb.enqueue("k", 300, 0)
	testenv.Eventually(t, 30*time.Second, "300 SUCCEEDED", func() bool { return kb.countStatus(task.Succeeded) == 300 })
	testenv.Eventually(t, 10*time.Second, "group lag 0", func() bool { return kb.lag() == 0 })
	if got := runs.Load(); got != 300 {
		t.Errorf("handlers ran %d times, want 300", got)
	}
	awaitMetric(t, reg, "ingest_task_process_total", result("succeeded"), 300)
}

// TestKafkaRetryThroughOutbox: a failed attempt is RETRYING in Postgres
// and published again through a new outbox row when due; each retry runs
// no earlier than its backoff.
func TestKafkaRetryThroughOutbox(t *testing.T) {
	t.Parallel()
	backoff := task.Backoff{Base: 300 * time.Millisecond, Max: 10 * time.Second}
	kb := ksetup(t, 8, task.Config{Backoff: backoff})
	var calls atomic.Int32
	w, reg := kb.worker(ingest.Config{}, map[string]ingest.Handler{
		"flaky": func(context.Context, ingest.Task) error {
			if calls.Add(1) <= 2 {
				return errors.New("flaky failure")
			}
			return nil
		},
	})
	kb.relay()
	kb.run(w)
	id := kb.enqueue("flaky", 1, 5)[0]
	testenv.Eventually(t, 20*time.Second, "SUCCEEDED", func() bool { return kb.task(id).Status == task.Succeeded })
	if tk := kb.task(id); tk.AttemptCount != 2 {
		t.Errorf("attempt_count = %d, want 2", tk.AttemptCount)
	}
	recs := kb.transitions(id)
	var path string
	for _, r := range recs {
		path += "→" + r.To
	}
	if want := "→QUEUED→RUNNING→RETRYING→RUNNING→RETRYING→RUNNING→SUCCEEDED"; path != want {
		t.Fatalf("transitions %s, want %s", path, want)
	}
	for i, failed := range []int{2, 4} {
		lo, hi := backoff.Bounds(i + 1)
		gap := recs[failed+1].CreatedAt.Sub(recs[failed].CreatedAt)
		t.Logf("retry %d ran %s after the failure (backoff %s..%s)", i+1, gap.Round(time.Millisecond), lo, hi)
		if gap < lo || gap > hi+10*time.Second { // milliseconds more; 10 s tells a stuck retry from a slow machine
			t.Errorf("retry %d ran %s after the failure, want between %s and %s", i+1, gap, lo, hi+10*time.Second)
		}
	}
	var rows, sent int
	if err := kb.db.QueryRow(kb.ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'SENT') FROM outbox_event WHERE task_id = $1`, id).Scan(&rows, &sent); err != nil {
		t.Fatal(err)
	}
	if rows != 3 || sent != 3 {
		t.Errorf("outbox rows %d (%d SENT), want 3 SENT: the first publish and one per retry", rows, sent)
	}
	awaitMetric(t, reg, "ingest_task_process_total", result("retry"), 2)
	// Every record of the task (key = task id) is on one partition.
	parts := map[int32]bool{}
	rs, err := kb.db.Query(kb.ctx, `SELECT stream_id FROM outbox_event WHERE task_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var sid string
		if err := rs.Scan(&sid); err != nil {
			t.Fatal(err)
		}
		_, p, _, _ := kafka.ParsePosition(sid)
		parts[p] = true
	}
	if len(parts) != 1 {
		t.Errorf("the task's records are on partitions %v, want one", parts)
	}
	testenv.Eventually(t, 10*time.Second, "group lag 0", func() bool { return kb.lag() == 0 })
}

// TestKafkaDeadGoesToDLQTopic: the last failed attempt makes the task DEAD
// and writes a record with the DLQ fields to the DLQ topic.
func TestKafkaDeadGoesToDLQTopic(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 2, task.Config{Backoff: task.Backoff{Base: 50 * time.Millisecond, Max: time.Second}})
	w, reg := kb.worker(ingest.Config{}, map[string]ingest.Handler{
		"bad":  func(context.Context, ingest.Task) error { return errors.New("always broken") },
		"perm": func(context.Context, ingest.Task) error { return ingest.Permanent(errors.New("bad input")) },
	})
	kb.relay()
	kb.run(w)
	bad := kb.enqueue("bad", 1, 2)[0]
	perm := kb.enqueue("perm", 1, 5)[0]
	testenv.Eventually(t, 20*time.Second, "both DEAD", func() bool {
		return kb.task(bad).Status == task.Dead && kb.task(perm).Status == task.Dead
	})
	testenv.Eventually(t, 10*time.Second, "group lag 0", func() bool { return kb.lag() == 0 })
	recs := kb.dlqRecords(2)
	if len(recs) != 2 {
		t.Fatalf("%d DLQ records, want 2", len(recs))
	}
	byTask := map[string]kafkaDLQ{}
	for _, r := range recs {
		e, err := kafka.DecodeDeadLetter(r)
		if err != nil {
			t.Fatal(err)
		}
		if string(r.Key) != e.TaskID {
			t.Errorf("DLQ record key %q, want the task id %s", r.Key, e.TaskID)
		}
		if _, _, _, err := kafka.ParsePosition(e.SourceID); err != nil || e.DeadAt.IsZero() {
			t.Errorf("DLQ record %+v: want a source record position and dead_at", e)
		}
		byTask[e.TaskID] = kafkaDLQ{e.Kind, e.AttemptCount, e.LastError}
	}
	if got := byTask[bad.String()]; got.kind != "bad" || got.attempts != 2 || got.lastError != "always broken" {
		t.Errorf("DLQ record of the exhausted task: %+v", got)
	}
	if got := byTask[perm.String()]; got.kind != "perm" || got.attempts != 1 {
		t.Errorf("DLQ record of the permanent failure: %+v", got)
	}
	awaitMetric(t, reg, "ingest_task_dlq_total", nil, 2)
}

type kafkaDLQ struct {
	kind      string
	attempts  int
	lastError string
}

// TestKafkaWorkerKilledMidBatch: a worker whose handlers never return (its
// process hangs, then goes away) commits nothing it did not finish; the
// next member of the group reads those records again and, once the leases
// have expired, takes the tasks over. Nothing is lost.
func TestKafkaWorkerKilledMidBatch(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 2, task.Config{})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	var started atomic.Int32
	a, _ := kb.worker(ingest.Config{ShutdownTimeout: 10 * time.Millisecond, Concurrency: 4}, map[string]ingest.Handler{
		"k": func(context.Context, ingest.Task) error { started.Add(1); <-hang; return nil },
	})
	kb.relay()
	stopA := kb.run(a)
	ids := kb.enqueue("k", 10, 5)
	testenv.Eventually(t, 10*time.Second, "4 handlers hung", func() bool { return started.Load() == 4 })
	stopA() // its handlers ignore cancellation: nothing is recorded or committed for them
	b, _ := kb.worker(ingest.Config{}, map[string]ingest.Handler{
		"k": func(context.Context, ingest.Task) error { return nil },
	})
	kb.run(b)
	testenv.Eventually(t, 30*time.Second, "all 10 SUCCEEDED", func() bool { return kb.countStatus(task.Succeeded) == 10 })
	tookOver := 0
	for _, id := range ids {
		for _, r := range kb.transitions(id) {
			if r.From == string(task.Running) && r.To == string(task.Running) {
				tookOver++
			}
		}
	}
	if tookOver != 4 {
		t.Errorf("%d takeovers, want 4 (the hung runs)", tookOver)
	}
	testenv.Eventually(t, 10*time.Second, "group lag 0", func() bool { return kb.lag() == 0 })
}

// TestKafkaRebalanceWhileHandlersRun: two workers share the partitions; the
// second joins while the first's handlers run, so partitions move under
// running handlers. Every task succeeds, a handler never runs a task twice
// at once, and the group ends with nothing uncommitted.
func TestKafkaRebalanceWhileHandlersRun(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 6, task.Config{})
	var mu sync.Mutex
	running := map[uuid.UUID]bool{}
	runs := map[uuid.UUID]int{}
	handler := func(ctx context.Context, tk ingest.Task) error {
		mu.Lock()
		if running[tk.ID] {
			t.Errorf("task %s runs twice at once", tk.ID)
		}
		running[tk.ID] = true
		runs[tk.ID]++
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // a handler at work
		mu.Lock()
		delete(running, tk.ID)
		mu.Unlock()
		return nil
	}
	a, _ := kb.worker(ingest.Config{Concurrency: 8}, map[string]ingest.Handler{"k": handler})
	b, _ := kb.worker(ingest.Config{Concurrency: 8}, map[string]ingest.Handler{"k": handler})
	kb.relay()
	kb.run(a)
	ids := kb.enqueue("k", 300, 0)
	testenv.Eventually(t, 10*time.Second, "handlers running", func() bool { return kb.countStatus(task.Succeeded) > 20 })
	kb.run(b)
	testenv.Eventually(t, 60*time.Second, "300 SUCCEEDED", func() bool { return kb.countStatus(task.Succeeded) == 300 })
	testenv.Eventually(t, 10*time.Second, "group lag 0", func() bool { return kb.lag() == 0 })
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if runs[id] != 1 {
			t.Errorf("task %s ran %d times, want 1", id, runs[id])
		}
	}
}
