package tracing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/webhook"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The end-to-end tests share one in-memory exporter behind the global
// provider (the library takes its tracer from it) and tell their spans
// apart by trace id. It is installed by the first of them: they are
// parallel, so they run after the sequential Setup tests, which need the
// global provider untouched.
var (
	installOnce sync.Once
	exporter    *tracetest.InMemoryExporter
)

func recorder() *tracetest.InMemoryExporter {
	installOnce.Do(func() {
		exporter = tracetest.NewInMemoryExporter()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter)))
	})
	return exporter
}

// spansOf returns the ended spans of trace id, by name.
func spansOf(id trace.TraceID) map[string][]tracetest.SpanStub {
	out := map[string][]tracetest.SpanStub{}
	for _, s := range recorder().GetSpans() {
		if s.SpanContext.TraceID() == id {
			out[s.Name] = append(out[s.Name], s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// newService returns a Service with test timings on a database and a
// redis-server of its own, running handler h for kind "k" until the test
// ends.
func newService(t *testing.T, consumer string, h ingest.Handler, logs io.Writer) *ingest.Service {
	t.Helper()
	return startService(t, testenv.NewDatabase(t), testenv.Client(t, testenv.NewRedisServer(t).URL()), consumer, h, logs)
}

// startService is newService on db and rdb; logs (nil: stderr, errors
// only) receives the service's log at level info.
func startService(t *testing.T, db *testenv.Database, rdb *redis.Client, consumer string, h ingest.Handler, logs io.Writer) *ingest.Service {
	t.Helper()
	// The default stream and DLQ: each test has a redis-server of its own.
	cfg := ingest.Config{
		Store:    task.Config{Backoff: task.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: 0.1}},
		Consumer: consumer, TaskLease: time.Second,
		ReclaimIdle: 300 * time.Millisecond, Block: 100 * time.Millisecond, ShutdownTimeout: 2 * time.Second,
		Reclaim: reclaim.Config{Interval: 100 * time.Millisecond},
		Relay: outbox.RelayConfig{PublishInterval: 100 * time.Millisecond,
			Backoff: backoff.Policy{Base: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: 0.1}},
		Maintenance: maintenance.Config{
			Rescuer:   maintenance.RescuerConfig{Interval: 200 * time.Millisecond, Grace: 300 * time.Millisecond},
			Retention: maintenance.RetentionConfig{Interval: 200 * time.Millisecond},
		},
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	if logs != nil {
		logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	svc, err := ingest.NewService(cfg, db.Pool, ingest.Redis(rdb), logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	svc.Handle("k", h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	})
	return svc
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// line returns the first log line containing s ("" when none).
func (b *syncBuffer) line(s string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for l := range strings.Lines(b.buf.String()) {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// hook is a webhook receiver that fails its first call with a 500 and
// records the traceparent header of every call.
type hook struct {
	mu     sync.Mutex
	parent []string
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.parent = append(h.parent, r.Header.Get("traceparent"))
	n := len(h.parent)
	h.mu.Unlock()
	if n == 1 {
		http.Error(w, "first call fails", http.StatusInternalServerError)
	}
}

func (h *hook) traceparents() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.parent)
}

// TestTraceparentHeaderReachesWebhookThroughRetry: a traceparent sent on
// POST /v1/tasks is the parent of the task's create span; the task keeps
// it; the publish span and both attempts (the first failing with a 500,
// the retry succeeding) are in the same trace, and both webhook POSTs
// carry a traceparent of that trace, each a child span of its attempt.
func TestTraceparentHeaderReachesWebhookThroughRetry(t *testing.T) {
	t.Parallel()
	recorder()
	rcv := &hook{}
	hookSrv := httptest.NewServer(rcv)
	t.Cleanup(hookSrv.Close)
	h, err := webhook.New(webhook.Config{URL: hookSrv.URL})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	svc := newService(t, "w1", h, logs)
	srv, err := api.New(api.Config{}, svc.Store(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	apiSrv := httptest.NewServer(srv)
	t.Cleanup(apiSrv.Close)

	const sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	traceID := tracing.SpanContext(sent).TraceID()
	req, _ := http.NewRequest(http.MethodPost, apiSrv.URL+"/v1/tasks", bytes.NewReader([]byte(`{"kind":"k","payload":{"n":1},"max_attempts":3}`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", sent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var created api.CreateResponse
	if err := json.NewDecoder(resp.Body).Decode(&created); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/tasks: %s, %v", resp.Status, err)
	}
	resp.Body.Close()

	testenv.Eventually(t, 20*time.Second, "task SUCCEEDED", func() bool {
		tk, err := svc.Store().Get(context.Background(), created.ID)
		return err == nil && tk.Status == task.Succeeded
	})
	tk, err := svc.Store().Get(context.Background(), created.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := tracing.SpanContext(tk.Traceparent); got.TraceID() != traceID {
		t.Errorf("task traceparent %q, want one of trace %s", tk.Traceparent, traceID)
	}
	// The attempt spans end when the completer has recorded the outcome.
	testenv.Eventually(t, 5*time.Second, "two attempt spans", func() bool { return len(spansOf(traceID)[tracing.SpanAttempt]) == 2 })
	spans := spansOf(traceID)

	creates := spans[tracing.SpanCreate]
	if len(creates) != 1 || creates[0].Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("create spans %+v, want one, a child of the header's span", creates)
	}
	if got := attr(creates[0], tracing.AttrTaskID).AsStringSlice(); !slices.Equal(got, []string{created.ID.String()}) {
		t.Errorf("create span task ids %v, want [%s]", got, created.ID)
	}
	if tk.Traceparent != tracing.FromSpanContext(creates[0].SpanContext) {
		t.Errorf("task traceparent %q is not its create span's %s", tk.Traceparent, creates[0].SpanContext.SpanID())
	}
	pubs := spans[tracing.SpanPublish]
	if len(pubs) == 0 || pubs[0].Parent.SpanID() != creates[0].SpanContext.SpanID() {
		t.Errorf("publish spans %+v, want a child of the create span", pubs)
	}

	attempts := spans[tracing.SpanAttempt]
	slices.SortFunc(attempts, func(a, b tracetest.SpanStub) int {
		return int(attr(a, tracing.AttrTaskAttempt).AsInt64() - attr(b, tracing.AttrTaskAttempt).AsInt64())
	})
	for i, want := range []struct {
		outcome string
		status  codes.Code
	}{{"retry", codes.Error}, {"succeeded", codes.Unset}} {
		a := attempts[i]
		if got := attr(a, tracing.AttrTaskAttempt).AsInt64(); got != int64(i+1) {
			t.Errorf("attempt span %d: attempt %d", i, got)
		}
		if got := attr(a, tracing.AttrOutcome).AsString(); got != want.outcome {
			t.Errorf("attempt %d: outcome %q, want %q", i+1, got, want.outcome)
		}
		if a.Status.Code != want.status {
			t.Errorf("attempt %d: status %v, want %v", i+1, a.Status, want.status)
		}
		if attr(a, tracing.AttrTaskID).AsString() != created.ID.String() || attr(a, tracing.AttrTaskKind).AsString() != "k" {
			t.Errorf("attempt %d attributes %v", i+1, a.Attributes)
		}
		if a.Parent.SpanID() != creates[0].SpanContext.SpanID() {
			t.Errorf("attempt %d parent %s, want the create span %s", i+1, a.Parent.SpanID(), creates[0].SpanContext.SpanID())
		}
	}

	if line := logs.line("task failed; retrying"); !strings.Contains(line, "trace_id="+traceID.String()) {
		t.Errorf("retry log line %q, want trace_id=%s", line, traceID)
	}

	// Each webhook POST carries the trace, as the client span that is a
	// child of its attempt.
	got := rcv.traceparents()
	if len(got) != 2 {
		t.Fatalf("webhook called %d times, want 2", len(got))
	}
	for i, tp := range got {
		sc := tracing.SpanContext(tp)
		if sc.TraceID() != traceID {
			t.Errorf("webhook call %d: traceparent %q, want trace %s", i+1, tp, traceID)
			continue
		}
		var client *tracetest.SpanStub
		for _, s := range spans["HTTP POST"] {
			if s.SpanContext.SpanID() == sc.SpanID() {
				client = &s
			}
		}
		if client == nil || client.Parent.SpanID() != attempts[i].SpanContext.SpanID() {
			t.Errorf("webhook call %d: traceparent %q is not a client span child of attempt %d (spans %v)", i+1, tp, i+1, spans["HTTP POST"])
		}
	}
}

// TestContextSpanIsParentThroughTakeover: a task created with a span in
// the library's context keeps that trace; it is started by hand under a
// short lease and abandoned (a worker that crashed), and the worker that
// takes it over runs attempt 2 in an attempt span of the same trace, whose
// context the handler gets.
func TestContextSpanIsParentThroughTakeover(t *testing.T) {
	t.Parallel()
	recorder()
	db := testenv.NewDatabase(t)
	rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx, root := otel.Tracer("test").Start(context.Background(), "caller")
	res, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), MaxAttempts: 5})
	root.End()
	if err != nil {
		t.Fatal(err)
	}
	traceID := root.SpanContext().TraceID()
	id := res.Task.ID
	// Worker A: started, then never heard of again.
	started, err := store.Start(context.Background(), "worker-a", 200*time.Millisecond, id)
	if err != nil || len(started) != 1 || started[0].Outcome != task.Started {
		t.Fatalf("start by hand: %+v, %v", started, err)
	}
	if got := tracing.SpanContext(started[0].Task.Traceparent).TraceID(); got != traceID {
		t.Fatalf("Start returned traceparent %q, want trace %s", started[0].Task.Traceparent, traceID)
	}

	type seen struct {
		attempt int
		sc      trace.SpanContext
	}
	ran := make(chan seen, 4)
	logs := &syncBuffer{}
	startService(t, db, rdb, "worker-b", func(ctx context.Context, tk ingest.Task) error {
		ran <- seen{tk.Attempt, trace.SpanContextFromContext(ctx)}
		return nil
	}, logs)
	var s seen
	select {
	case s = <-ran:
	case <-time.After(20 * time.Second):
		t.Fatal("worker B did not take the task over within 20s")
	}
	if s.attempt != 2 || s.sc.TraceID() != traceID {
		t.Fatalf("worker B ran attempt %d in trace %s, want attempt 2 in trace %s", s.attempt, s.sc.TraceID(), traceID)
	}
	testenv.Eventually(t, 10*time.Second, "attempt span of worker B", func() bool { return len(spansOf(traceID)[tracing.SpanAttempt]) == 1 })
	a := spansOf(traceID)[tracing.SpanAttempt][0]
	if a.SpanContext.SpanID() != s.sc.SpanID() {
		t.Errorf("the handler's context holds span %s, not the attempt span %s", s.sc.SpanID(), a.SpanContext.SpanID())
	}
	if got := attr(a, tracing.AttrTaskAttempt).AsInt64(); got != 2 {
		t.Errorf("attempt span: attempt %d, want 2", got)
	}
	if got := attr(a, tracing.AttrOutcome).AsString(); got != "succeeded" {
		t.Errorf("attempt span: outcome %q, want succeeded", got)
	}
	creates := spansOf(traceID)[tracing.SpanCreate]
	if len(creates) != 1 || creates[0].Parent.SpanID() != root.SpanContext().SpanID() || a.Parent.SpanID() != creates[0].SpanContext.SpanID() {
		t.Errorf("create spans %v and attempt parent %s: want caller → create → attempt", creates, a.Parent.SpanID())
	}
	if pubs := spansOf(traceID)[tracing.SpanPublish]; len(pubs) == 0 {
		t.Errorf("no publish span in trace %s", traceID)
	}
	if line := logs.line("took over a task"); !strings.Contains(line, "trace_id="+traceID.String()) {
		t.Errorf("takeover log line %q, want trace_id=%s", line, traceID)
	}
}

// TestExplicitTraceparentWinsAndIsChecked: NewTask.Traceparent is kept as
// given (the create span links to it); a malformed one is refused naming
// the field.
func TestExplicitTraceparentWinsAndIsChecked(t *testing.T) {
	t.Parallel()
	recorder()
	store, err := task.NewStore(task.Config{}, testenv.NewDatabase(t).Pool)
	if err != nil {
		t.Fatal(err)
	}
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx, span := otel.Tracer("test").Start(context.Background(), "caller")
	defer span.End()
	res, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), Traceparent: tp})
	if err != nil || res.Task.Traceparent != tp {
		t.Fatalf("Create = %q, %v; want traceparent %q", res.Task.Traceparent, err, tp)
	}
	creates := spansOf(span.SpanContext().TraceID())[tracing.SpanCreate]
	if len(creates) != 1 || len(creates[0].Links) != 1 || creates[0].Links[0].SpanContext.TraceID() != tracing.SpanContext(tp).TraceID() {
		t.Errorf("create spans %+v, want one linked to %s", creates, tp)
	}
	_, err = store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), Traceparent: "00-nope"})
	if !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), "traceparent") {
		t.Errorf("Create with a malformed traceparent = %v, want a traceparent field error", err)
	}
	untraced, err := store.Create(context.Background(), task.NewTask{Kind: "k", Payload: json.RawMessage(`{"n":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	// With a recording provider a create without a parent is a new trace.
	if sc := tracing.SpanContext(untraced.Task.Traceparent); !sc.IsValid() || sc.TraceID() == span.SpanContext().TraceID() {
		t.Errorf("task created without a parent: traceparent %q, want a new trace", untraced.Task.Traceparent)
	}
}
