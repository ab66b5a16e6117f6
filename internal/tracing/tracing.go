package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the spans of ingest-worker.
const ScopeName = "github.com/ingest-worker/ingest"

// Span names.
const (
	SpanCreate  = "ingest.task.create"
	SpanPublish = "ingest.task.publish"
	SpanAttempt = "ingest.task.attempt"
	// SpanBatch is a batch handler's call: a root span linked to the
	// attempt spans of its tasks.
	SpanBatch = "ingest.task.batch"
)

// Attribute keys of the spans.
const (
	AttrTaskID      = "ingest.task.id"
	AttrTaskKind    = "ingest.task.kind"
	AttrTaskAttempt = "ingest.task.attempt"
	AttrOutcome     = "ingest.task.outcome"
	AttrTaskCount   = "ingest.task.count"
	AttrStream      = "ingest.stream"
)

// Header is the W3C Trace Context header (and stream entry field) name.
const Header = "traceparent"

// propagator is W3C Trace Context alone, whatever the global propagator
// is: the traceparent kept with a task is always in that format.
var propagator = propagation.TraceContext{}

// Tracer returns the tracer of ingest-worker from the global provider.
func Tracer() trace.Tracer { return otel.GetTracerProvider().Tracer(ScopeName) }

// Inject returns the traceparent of the span in ctx, or "" when ctx holds
// no valid span context.
func Inject(ctx context.Context) string {
	return FromSpanContext(trace.SpanContextFromContext(ctx))
}

// FromSpanContext returns sc as a traceparent, or "" when sc is invalid.
func FromSpanContext(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c[Header]
}

// Extract returns ctx with the remote span context of traceparent tp as
// its parent span. An empty or malformed tp leaves ctx as it is.
func Extract(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{Header: tp})
}

// SpanContext parses traceparent tp; the zero SpanContext (invalid) when
// it is empty or malformed.
func SpanContext(tp string) trace.SpanContext {
	if tp == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(Extract(context.Background(), tp))
}

// Valid reports whether tp is a well-formed traceparent of a valid span
// context.
func Valid(tp string) bool { return SpanContext(tp).IsValid() }

// ExtractHeader returns ctx with the parent carried by the traceparent
// header of h, if any (a malformed one is ignored).
func ExtractHeader(ctx context.Context, h http.Header) context.Context {
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// TraceID returns the trace id of the span in ctx as hex, or "".
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// Propagator returns the W3C Trace Context propagator the traceparent is
// carried with (for otelhttp.WithPropagators).
func Propagator() propagation.TextMapPropagator { return propagator }
