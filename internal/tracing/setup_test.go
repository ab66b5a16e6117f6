package tracing_test

import (
	"context"
	"slices"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ingest-worker/ingest/internal/tracing"
)

// These tests are sequential (Setup changes the global provider): they
// run before the parallel end-to-end tests install theirs.

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console"}, true},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}, false},
	} {
		if got := tracing.Enabled(env(tc.env)); got != tc.want {
			t.Errorf("Enabled(%v) = %v, want %v", tc.env, got, tc.want)
		}
	}
}

// TestSetupWithNothingConfiguredIsNoop: without OTEL_* variables Setup
// installs no provider; spans stay no-op (not recording, nothing
// exported), while a traceparent is still carried through.
func TestSetupWithNothingConfiguredIsNoop(t *testing.T) {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	before := otel.GetTracerProvider()
	shutdown, err := tracing.Setup(context.Background(), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if _, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider); sdk || otel.GetTracerProvider() != before {
		t.Fatalf("Setup with nothing configured installed provider %T", otel.GetTracerProvider())
	}
	ctx, span := tracing.Tracer().Start(context.Background(), "x")
	if span.IsRecording() || span.SpanContext().IsValid() || tracing.Inject(ctx) != "" {
		t.Errorf("a span without a parent records (%v) or has a context (%v)", span.IsRecording(), span.SpanContext())
	}
	span.End()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	_, child := tracing.Tracer().Start(tracing.Extract(context.Background(), tp), "y")
	if child.IsRecording() || tracing.FromSpanContext(child.SpanContext()) != tp {
		t.Errorf("no-op span under %s: recording %v, context %v; want the parent passed through", tp, child.IsRecording(), child.SpanContext())
	}

	// OTEL_TRACES_EXPORTER=none: no provider either.
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	if _, err := tracing.Setup(context.Background(), env(map[string]string{"OTEL_TRACES_EXPORTER": "none"})); err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Fatalf("Setup with OTEL_TRACES_EXPORTER=none installed provider %T", otel.GetTracerProvider())
	}
}

// TestSetupRejectsUnknownExporter: a bad OTEL_TRACES_EXPORTER is an error
// naming the variable.
func TestSetupRejectsUnknownExporter(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
	_, err := tracing.Setup(context.Background(), env(map[string]string{"OTEL_TRACES_EXPORTER": "carrier-pigeon"}))
	if err == nil {
		t.Fatal("Setup accepted OTEL_TRACES_EXPORTER=carrier-pigeon")
	}
	t.Log(err)
}

// TestSetupConsoleInstallsProvider: OTEL_TRACES_EXPORTER=console installs
// a recording SDK provider (spans printed to stdout) and the W3C
// propagator; shutdown flushes it.
func TestSetupConsoleInstallsProvider(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "console")
	shutdown, err := tracing.Setup(context.Background(), env(map[string]string{"OTEL_TRACES_EXPORTER": "console"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, sdk := otel.GetTracerProvider().(*sdktrace.TracerProvider); !sdk {
		t.Fatalf("provider %T, want the SDK's", otel.GetTracerProvider())
	}
	_, span := tracing.Tracer().Start(context.Background(), "console-test")
	if !span.IsRecording() || !span.SpanContext().IsValid() {
		t.Errorf("span not recording under the console provider")
	}
	span.End()
	if fields := otel.GetTextMapPropagator().Fields(); !slices.Contains(fields, "traceparent") {
		t.Errorf("global propagator fields %v, want traceparent", fields)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
