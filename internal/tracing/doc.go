// Package tracing owns the OpenTelemetry plumbing of ingest-worker: the
// tracer and span names, the W3C traceparent carried with a task (the
// ingest_task.traceparent column, the stream entry field, the API header;
// docs/ARCHITECTURE.md §3, §4.2, §7), and Setup, which installs a tracer
// provider configured by the standard OTEL_* variables.
//
// Library packages take their tracer from the global provider
// (otel.GetTracerProvider) at each call, so without Setup (or a test's
// otel.SetTracerProvider) every span is the no-op one. A traceparent is
// still carried through when tracing is off: a task created under a
// remote parent keeps it, and the webhook POST forwards it.
package tracing
