package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ingest-worker/ingest/internal/tracing"
)

// tracingFlushTimeout bounds the export of the last spans at exit.
const tracingFlushTimeout = 5 * time.Second

// startTracing installs the tracer provider the OTEL_* variables ask for
// (none when they ask for nothing; see tracing.Setup) and returns the
// function that flushes and stops it, to defer.
func (a *app) startTracing(ctx context.Context) (func(), error) {
	getenv := func(k string) string { v, _ := a.lookup(k); return v }
	shutdown, err := tracing.Setup(ctx, getenv)
	if err != nil {
		return nil, usageErr(fmt.Errorf("tracing: %w", err))
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			a.notef("tracing: flushing spans at exit: %v\n", err)
		}
	}, nil
}
