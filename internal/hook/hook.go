// Package hook owns the instrumentation hooks that the module's own
// benchmarks attach to a worker without widening its public API: a hook
// travels in the context given to Worker.Run (or Service.Run), and only
// packages of this module can put one there.
package hook

import (
	"context"

	"github.com/google/uuid"
)

type succeededKey struct{}

// WithOnSucceeded returns a context that makes a worker run with it call f
// right after each transaction that made tasks SUCCEEDED committed, before
// their entries are acknowledged. f must return quickly and may be called
// from several goroutines at once.
func WithOnSucceeded(ctx context.Context, f func(ids []uuid.UUID)) context.Context {
	return context.WithValue(ctx, succeededKey{}, f)
}

// OnSucceeded returns the hook set by WithOnSucceeded, or nil.
func OnSucceeded(ctx context.Context) func(ids []uuid.UUID) {
	f, _ := ctx.Value(succeededKey{}).(func(ids []uuid.UUID))
	return f
}
