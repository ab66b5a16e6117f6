package outbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingest-worker/ingest/internal/tracing"
)

// startPublishSpans starts one publish span per row whose task has a
// traceparent, a child of it (nil when no span records: tracing is off).
// Rows without one publish untraced.
func startPublishSpans(rows []row) []trace.Span {
	tracer := tracing.Tracer()
	var spans []trace.Span
	for i, rw := range rows {
		if rw.traceparent == "" {
			continue
		}
		// The task's trace, not whatever span the relay pass runs under.
		parent := tracing.Extract(context.Background(), rw.traceparent)
		_, span := tracer.Start(parent, tracing.SpanPublish,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(
				attribute.String(tracing.AttrTaskID, rw.taskID.String()),
				attribute.String(tracing.AttrTaskKind, rw.kind),
				attribute.String(tracing.AttrStream, rw.stream),
			))
		if !span.IsRecording() {
			return nil // one provider for the whole pass
		}
		if spans == nil {
			spans = make([]trace.Span, len(rows))
		}
		spans[i] = span
	}
	return spans
}

// endPublishSpans ends the spans of startPublishSpans with each row's
// entry id or error.
func endPublishSpans(spans []trace.Span, ids []string, errs []error) {
	for i, span := range spans {
		if span == nil {
			continue
		}
		if errs[i] != nil {
			span.RecordError(errs[i])
			span.SetStatus(codes.Error, errs[i].Error())
		} else {
			span.SetAttributes(attribute.String("messaging.message.id", ids[i]))
		}
		span.End()
	}
}
