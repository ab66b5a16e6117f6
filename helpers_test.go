package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// bundle is what one test (on one Redis backend) works with.
type bundle struct {
	t      *testing.T
	ctx    context.Context
	b      testenv.Backend
	rdb    *redis.Client
	db     *pgxpool.Pool
	store  *task.Store
	stream string
	dlq    string
	group  string
	logs   *logRecorder
}

func setup(t *testing.T, b testenv.Backend, storeCfg task.Config) *bundle {
	t.Helper()
	streamKey, dlqKey := testenv.Keys(t)
	db := testenv.DB(t)
	storeCfg.Stream = streamKey
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
	return &bundle{t: t, ctx: context.Background(), b: b, rdb: b.Client, db: db, store: store,
		stream: streamKey, dlq: dlqKey, group: stream.DefaultGroup, logs: logs}
}

// worker returns a worker of the test's keys with fast test timings;
// fields set in cfg win.
func (bd *bundle) worker(cfg ingest.Config, handlers map[string]ingest.Handler) (*ingest.Worker, *prometheus.Registry) {
	bd.t.Helper()
	cfg.Stream, cfg.DLQ = bd.stream, bd.dlq
	if cfg.Consumer == "" {
		cfg.Consumer = "w-" + uuid.NewString()[:8]
	}
	if cfg.Block == 0 {
		cfg.Block = 100 * time.Millisecond
	}
	if cfg.TaskLease == 0 {
		cfg.TaskLease = time.Second
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 2 * time.Second
	}
	reg := prometheus.NewRegistry()
	w, err := ingest.New(cfg, bd.store, bd.rdb, slog.New(bd.logs), reg)
	if err != nil {
		bd.t.Fatal(err)
	}
	for k, h := range handlers {
		w.Handle(k, h)
	}
	return w, reg
}

// run runs w until the returned stop is called (or the test ends).
func (bd *bundle) run(w *ingest.Worker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					bd.t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				bd.t.Errorf("Run did not return within 30s of cancel")
			}
		})
	}
	bd.t.Cleanup(stop)
	return stop
}

// enqueue creates n tasks of kind and adds their entries to the stream.
func (bd *bundle) enqueue(kind string, n, maxAttempts int) []uuid.UUID {
	bd.t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), MaxAttempts: maxAttempts}
	}
	res, err := bd.store.CreateBatch(bd.ctx, nts)
	if err != nil {
		bd.t.Fatal(err)
	}
	ids := make([]uuid.UUID, n)
	entries := make([]stream.Entry, n)
	for i, r := range res {
		ids[i] = r.Task.ID
		entries[i] = stream.Entry{TaskID: r.Task.ID, Kind: kind}
	}
	bd.add(entries...)
	return ids
}

// add XADDs task entries to the test's stream in one pipeline.
func (bd *bundle) add(entries ...stream.Entry) {
	bd.t.Helper()
	if _, err := bd.rdb.Pipelined(bd.ctx, func(p redis.Pipeliner) error {
		for _, e := range entries {
			p.XAdd(bd.ctx, &redis.XAddArgs{Stream: bd.stream, Values: e.Values()})
		}
		return nil
	}); err != nil {
		bd.t.Fatalf("xadd %s: %v", bd.stream, err)
	}
}

// eventually waits for cond (see testenv.Eventually).
func (bd *bundle) eventually(timeout time.Duration, what string, cond func() bool) {
	bd.t.Helper()
	testenv.Eventually(bd.t, timeout, what, cond)
}

func (bd *bundle) task(id uuid.UUID) task.Task {
	bd.t.Helper()
	t, err := bd.store.Get(bd.ctx, id)
	if err != nil {
		bd.t.Fatal(err)
	}
	return t
}

func (bd *bundle) statusIs(id uuid.UUID, s task.State) func() bool {
	return func() bool { return bd.task(id).Status == s }
}

func (bd *bundle) countStatus(s task.State) int {
	bd.t.Helper()
	var n int
	if err := bd.db.QueryRow(bd.ctx, `SELECT count(*) FROM ingest_task WHERE status = $1`, string(s)).Scan(&n); err != nil {
		bd.t.Fatal(err)
	}
	return n
}

func (bd *bundle) transitions(id uuid.UUID) []transition.Record {
	bd.t.Helper()
	recs, err := transition.List(bd.ctx, bd.db, id)
	if err != nil {
		bd.t.Fatal(err)
	}
	return recs
}

// path renders a task's audit trail as QUEUED→RUNNING→….
func (bd *bundle) path(id uuid.UUID) string {
	var parts []string
	for _, r := range bd.transitions(id) {
		parts = append(parts, r.To)
	}
	return strings.Join(parts, "→")
}

func (bd *bundle) pending() int64 {
	bd.t.Helper()
	p, err := bd.rdb.XPending(bd.ctx, bd.stream, bd.group).Result()
	if err != nil {
		bd.t.Fatalf("xpending: %v", err)
	}
	return p.Count
}

func (bd *bundle) pendingIDs() []string {
	bd.t.Helper()
	ps, err := bd.rdb.XPendingExt(bd.ctx, &redis.XPendingExtArgs{Stream: bd.stream, Group: bd.group, Start: "-", End: "+", Count: 1000}).Result()
	if err != nil {
		bd.t.Fatalf("xpending: %v", err)
	}
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.ID)
	}
	return ids
}

func (bd *bundle) dlqEntries() []redis.XMessage {
	bd.t.Helper()
	msgs, err := bd.rdb.XRange(bd.ctx, bd.dlq, "-", "+").Result()
	if err != nil {
		bd.t.Fatalf("xrange dlq: %v", err)
	}
	return msgs
}

// reclaim stands in for the reclaimer (package reclaim): it XAUTOCLAIMs
// entries idle for minIdle to w's consumer every 20ms and feeds w's Sink.
// Unlike the reclaimer it does not wait for a slot ahead of the consumer
// (stream.SlotWaiter): a worker it feeds needs a slot beside the one its
// consumer's blocking read holds while the stream is idle.
func (bd *bundle) reclaim(w *ingest.Worker, minIdle time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	cfg := w.Config()
	sink := w.Sink()
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			n := sink.Reserve(10)
			if n == 0 {
				continue
			}
			msgs, _, err := bd.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: cfg.Stream, Group: cfg.Group,
				Consumer: cfg.Consumer, MinIdle: minIdle, Start: "0-0", Count: int64(n)}).Result()
			if err != nil {
				if ctx.Err() == nil {
					bd.logs.Handle(ctx, slog.NewRecord(time.Now(), slog.LevelWarn, "test reclaim: "+err.Error(), 0))
				}
				msgs = nil
			}
			sink.Process(ctx, msgs, n)
		}
	}()
	bd.t.Cleanup(func() { cancel(); <-done })
}

// metric returns the value of a counter or gauge with the given labels
// (0 when absent).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return value(m)
		}
	}
	return 0
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

func result(r string) map[string]string { return map[string]string{"result": r} }

// awaitMetric waits until a metric reaches want. The worker counts an
// outcome after the write that records it, so a test that has seen the
// write must still wait for the count.
func awaitMetric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string, want float64) {
	t.Helper()
	var got float64
	deadline := time.Now().Add(5 * time.Second)
	for {
		if got = metric(t, reg, name, labels); got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// logRecorder is a slog.Handler that keeps records for assertions.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, b.String())
	return nil
}
func (l *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logView{root: l, attrs: as}
}
func (l *logRecorder) WithGroup(string) slog.Handler { return l }

// count returns how many lines contain s.
func (l *logRecorder) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

func (l *logRecorder) dump(t *testing.T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		t.Log(line)
	}
}

// logView is a logRecorder with attributes.
type logView struct {
	root  *logRecorder
	attrs []slog.Attr
}

func (v *logView) Enabled(context.Context, slog.Level) bool { return true }
func (v *logView) Handle(ctx context.Context, r slog.Record) error {
	r2 := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r2.AddAttrs(v.attrs...)
	r.Attrs(func(a slog.Attr) bool { r2.AddAttrs(a); return true })
	return v.root.Handle(ctx, r2)
}
func (v *logView) WithAttrs(as []slog.Attr) slog.Handler {
	return &logView{root: v.root, attrs: append(append([]slog.Attr{}, v.attrs...), as...)}
}
func (v *logView) WithGroup(string) slog.Handler { return v }
