package outbox

// Test seams for the external test package (which may import task; this
// package may not, since task imports it).

// SetAfterPublish makes r call f between its XADD and the update that
// marks the rows.
func SetAfterPublish(r *Relay, f func()) { r.afterPublish = f }

// Listens reports how many LISTEN connections r has established.
func Listens(r *Relay) int64 { return r.listens.Load() }

// ClaimStatements are the relay's claim ($1 relay, $2 batch size, $3 lease
// in ms) and the planner settings sent with it (for the plan test).
func ClaimStatements() (settings, claim string) { return claimPlanSQL, claimSQL }

// Running reports whether r's Run is running (and takes direct claims).
func Running(r *Relay) bool { return r.running.Load() }

// ClaimLen is the number of rows c holds: 0 when they were written
// unclaimed, for the relays' usual passes.
func ClaimLen(c Claim) int { return len(c.c.rows) }
