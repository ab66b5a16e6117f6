package ingest

import (
	"context"
	"fmt"
)

// loadDependencies reads the results of t's dependencies into
// t.Dependencies before its handler runs, for a task that has
// dependencies only (a task without them costs nothing). A failed read is
// the run's failure: the task is retried like after a handler error.
func (p *processor) loadDependencies(ctx context.Context, t *Task) error {
	if !t.hasDependencies {
		return nil
	}
	deps, err := p.store.DependencyResults(ctx, t.ID)
	if err != nil {
		return fmt.Errorf("read the results of the dependencies: %w", err)
	}
	t.Dependencies = deps
	return nil
}
