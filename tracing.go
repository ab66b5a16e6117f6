package ingest

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingest-worker/ingest/internal/tracing"
)

// startAttempt starts the attempt span of a run of t, a child of the
// task's traceparent (tp: the task row's, else the stream entry's), and
// returns ctx carrying it: a handler's spans are its children. With no
// tracer provider installed and no traceparent, the span would record
// nothing and carry no trace: the run keeps none (nil), so that a run
// waiting in flight holds no span and no context for it.
func startAttempt(ctx context.Context, t Task, tp string) (context.Context, trace.Span) {
	parent := tracing.Extract(context.Background(), tp)
	_, span := tracing.Tracer().Start(parent, tracing.SpanAttempt,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String(tracing.AttrTaskID, t.ID.String()),
			attribute.String(tracing.AttrTaskKind, t.Kind),
			attribute.Int(tracing.AttrTaskAttempt, t.Attempt),
		))
	if !span.IsRecording() && !span.SpanContext().IsValid() {
		span.End()
		return ctx, nil
	}
	return trace.ContextWithSpan(ctx, span), span
}

// endAttempt ends the attempt span of r with the run's outcome (a result
// label: succeeded, retry, dead, released, conflict) and error.
func (r *run) endAttempt(result string, err error, timedOut bool) {
	span := r.span
	if span == nil {
		return
	}
	r.span = nil
	if span.IsRecording() {
		span.SetAttributes(attribute.String(tracing.AttrOutcome, result))
		if timedOut {
			span.SetAttributes(attribute.Bool("ingest.task.timeout", true))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// traceAttr is the trace_id log attribute of r's attempt, or the empty
// attribute (which log handlers omit) when it has no trace.
func (r *run) traceAttr() slog.Attr { return traceAttr(r.traceID) }

// traceAttr is the trace_id log attribute of trace id id (hex), or the
// empty attribute when id is empty or the invalid (all-zero) id.
func traceAttr(id string) slog.Attr {
	if id == "" || id == (trace.TraceID{}).String() {
		return slog.Attr{}
	}
	return slog.String("trace_id", id)
}
