package tracing

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ServiceName is the default service.name of the exported spans
// (OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES override it).
const ServiceName = "ingest-worker"

// Enabled reports whether the OTEL_* variables, looked up with getenv,
// ask for traces: OTEL_TRACES_EXPORTER is set to something other than
// "none", or an OTLP endpoint is (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and OTEL_SDK_DISABLED is not true.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp != "" {
		return exp != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs a global tracer provider and the W3C Trace Context (and
// baggage) propagator when the OTEL_* variables ask for traces (see
// Enabled; getenv looks them up, usually os.Getenv). The exporter is the
// one go.opentelemetry.io/contrib/exporters/autoexport picks from
// OTEL_TRACES_EXPORTER (otlp by default, with OTEL_EXPORTER_OTLP_*;
// console prints spans to stdout), behind a batch span processor
// (OTEL_BSP_*). autoexport and the SDK read those variables themselves.
//
// With nothing configured Setup installs nothing: the global provider
// stays the no-op one and spans cost next to nothing. The returned
// shutdown flushes and stops the provider (a no-op then).
func Setup(ctx context.Context, getenv func(string) string) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if !Enabled(getenv) {
		return noop, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return noop, fmt.Errorf("OTEL_TRACES_EXPORTER: %w", err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return noop, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", ServiceName)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return noop, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}
