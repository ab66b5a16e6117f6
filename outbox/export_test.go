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

// RescueStatements are the rescuer's candidate queries and its re-check,
// each with example arguments as SQL literals (for the plan test).
func RescueStatements() map[string][2]string {
	const page = `'-infinity', '00000000-0000-0000-0000-000000000000', 100, 60000`
	return map[string][2]string{
		"queued":        {rescueQueuedSQL, page},
		"retrying":      {rescueRetryingSQL, page},
		"running":       {rescueRunningSQL, page},
		"still-missing": {stillMissingSQL, `'{00000000-0000-7000-8000-000000000001}', '{0}'`},
	}
}

// ClaimStatements are the relay's claim ($1 relay, $2 batch size, $3 lease
// in ms) and the planner settings sent with it (for the plan test).
func ClaimStatements() (settings, claim string) { return claimPlanSQL, claimSQL }

// Running reports whether r's Run is running (and takes direct claims).
func Running(r *Relay) bool { return r.running.Load() }
