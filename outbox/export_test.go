package outbox

import "context"

// Test seams for the external test package (which may import task; this
// package may not, since task imports it).

// SetAfterPublish makes r call f between its XADD and the update that
// marks the rows.
func SetAfterPublish(r *Relay, f func()) { r.afterPublish = f }

// Listens reports how many LISTEN connections r has established.
func Listens(r *Relay) int64 { return r.listens.Load() }

// RunOnce runs one rescuer pass.
func (r *Rescuer) RunOnce(ctx context.Context) (RescueResult, error) { return r.runOnce(ctx) }

// RunOnce runs one retention pass.
func (r *Retention) RunOnce(ctx context.Context) (RetentionResult, error) { return r.runOnce(ctx) }
