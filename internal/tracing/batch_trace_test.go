package tracing_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/task"
)

// TestBatchSpanLinksTheAttempts: a batch handler's call is a root span
// linked to the attempt spans of its tasks (each in its creator's trace),
// the handler's ctx holds it, and each task's Context holds its attempt.
func TestBatchSpanLinksTheAttempts(t *testing.T) {
	t.Parallel()
	recorder()
	db := testenv.NewDatabase(t)
	svc := startService(t, db, testenv.Client(t, testenv.NewRedisServer(t).URL()), "w", func(context.Context, ingest.Task) error { return nil }, nil)
	type call struct {
		batch    trace.SpanContext
		attempts []trace.SpanContext
	}
	calls := make(chan call, 1)
	if err := svc.HandleBatch("b", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		c := call{batch: trace.SpanContextFromContext(ctx)}
		outs := make([]ingest.Outcome, len(tasks))
		for i, tk := range tasks {
			c.attempts = append(c.attempts, trace.SpanContextFromContext(tk.Context()))
			outs[i] = tk.Outcome(nil, nil)
		}
		calls <- c
		return outs, nil
	}, ingest.BatchOptions{Max: 2, Wait: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var traces []trace.TraceID
	for range 2 {
		ctx, root := otel.Tracer("test").Start(context.Background(), "caller")
		_, err := svc.Store().Create(ctx, task.NewTask{Kind: "b", Payload: json.RawMessage(`{}`)})
		root.End()
		if err != nil {
			t.Fatal(err)
		}
		traces = append(traces, root.SpanContext().TraceID())
	}
	var c call
	select {
	case c = <-calls:
	case <-time.After(time.Minute):
		t.Fatal("the batch handler was not called within a minute")
	}
	if len(c.attempts) != 2 || !c.batch.IsValid() {
		t.Fatalf("a batch of %d with span %v, want 2 tasks and a batch span", len(c.attempts), c.batch)
	}
	var batch tracetest.SpanStub
	testenv.Eventually(t, 10*time.Second, "the batch span ended", func() bool {
		for _, s := range recorder().GetSpans() {
			if s.Name == tracing.SpanBatch && s.SpanContext.SpanID() == c.batch.SpanID() {
				batch = s
				return true
			}
		}
		return false
	})
	if batch.Parent.IsValid() || batch.SpanContext.TraceID() == traces[0] || batch.SpanContext.TraceID() == traces[1] {
		t.Errorf("batch span parent %v in trace %s: want a root of its own", batch.Parent, batch.SpanContext.TraceID())
	}
	if got := attr(batch, tracing.AttrTaskCount).AsInt64(); got != 2 {
		t.Errorf("batch span count %d, want 2", got)
	}
	linked := map[trace.SpanID]bool{}
	for _, l := range batch.Links {
		linked[l.SpanContext.SpanID()] = true
	}
	for i, a := range c.attempts {
		if !linked[a.SpanID()] {
			t.Errorf("task %d's attempt span %s is not linked from the batch span (links %v)", i, a.SpanID(), batch.Links)
		}
		if a.TraceID() != traces[0] && a.TraceID() != traces[1] {
			t.Errorf("task %d's Context holds a span of trace %s, not its creator's", i, a.TraceID())
		}
	}
}
