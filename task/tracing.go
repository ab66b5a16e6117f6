package task

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingest-worker/ingest/internal/tracing"
)

// maxSpanKinds bounds the distinct kinds listed on a create span.
const maxSpanKinds = 20

// startCreateSpan starts the create span of one Create, CreateBatch or
// CreateTx call, a child of the span in ctx. The tasks created without an
// explicit Traceparent take it as their parent; an explicit one is linked.
func startCreateSpan(ctx context.Context, nts []NewTask) (context.Context, trace.Span) {
	tracer := tracing.Tracer()
	var links []trace.Link
	kinds := make([]string, 0, 1)
	seen := map[string]bool{}
	for _, nt := range nts {
		if sc := tracing.SpanContext(nt.Traceparent); sc.IsValid() && len(links) < 128 {
			links = append(links, trace.Link{SpanContext: sc})
		}
		if !seen[nt.Kind] && len(kinds) < maxSpanKinds {
			seen[nt.Kind] = true
			kinds = append(kinds, nt.Kind)
		}
	}
	return tracer.Start(ctx, tracing.SpanCreate,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.Int(tracing.AttrTaskCount, len(nts)),
			attribute.StringSlice(tracing.AttrTaskKind, kinds),
		))
}

// endCreateSpan records the ids of the created tasks (or err) and ends
// span.
func endCreateSpan(span trace.Span, res []CreateResult, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		ids := make([]string, len(res))
		for i, r := range res {
			ids[i] = r.Task.ID.String()
		}
		span.SetAttributes(attribute.StringSlice(tracing.AttrTaskID, ids))
	}
	span.End()
}
