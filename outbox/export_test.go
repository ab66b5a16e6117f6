package outbox

import (
	"context"
	"time"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// Test seams for the external test package (which may import task; this
// package may not, since task imports it).

// SetAfterPublish makes r call f between its XADD and the update that
// marks the rows.
func SetAfterPublish(r *Relay, f func()) { r.afterPublish = f }

// Listens reports how many LISTEN connections r has established.
func Listens(r *Relay) int64 { return r.listens.Load() }

// ClaimStatements are the relay's claim ($1 batch size, $2 its bound on
// the claim index) and the planner settings sent before it in its
// transaction (for the plan test).
func ClaimStatements() (settings, claim string) { return claimPlanSQL, claimSQL }

// Running reports whether r's Run is running (and takes direct claims).
func Running(r *Relay) bool { return r.running.Load() }

// ClaimLen is the number of rows c holds: 0 when they were written
// unclaimed, for the relays' usual passes.
func ClaimLen(c Claim) int { return len(c.c.rows) }

// HotPathStatements are the statements that publish a task (for the plan
// test on a never-analyzed database): each with the settings the relay
// sends it with ("" for none), and example arguments as SQL literals.
func HotPathStatements() map[string][3]string {
	const ids, taskIDs = `'{1,2}'`, `'{00000000-0000-7000-8000-000000000001,00000000-0000-7000-8000-000000000002}'`
	return map[string][3]string{
		"claim":          {claimPlanSQL, claimSQL, `1000, '-infinity'`},
		"mark-sent-pass": {pgplan.Settings, markSentLockedSQL, `'r', ` + ids + `, '{1-1,1-2}', '{s,s:p1}'`},
		"mark-fail-pass": {pgplan.Settings, markFailedLockedSQL, ids + `, '{boom,boom}', 10, 1, 1000, 0.1`},
		"mark-sent":      {pgplan.Settings, markSentSQL, `'r', now(), ` + ids + `, '{1-1,1-2}', '{s,s:p1}'`},
		"mark-failed":    {pgplan.Settings, markFailedSQL, `'r', now(), ` + ids + `, '{boom,boom}', 10, 1, 1000, 0.1`},
		"insert":         {"", insertSQL, taskIDs + `, 's', '{NULL,NULL}'`},
		"insert-claimed": {"", insertClaimedSQL, taskIDs + `, '{s,s}', 'r', 60000`},
		"insert-sent":    {"", insertSentSQL, taskIDs + `, '{s,s}', '{1-1,1-2}'`},
		"insert-failed":  {"", insertFailedSQL, taskIDs + `, '{s,s}', '{boom,boom}', 10, 1, 1000, 0.1`},
		"next-due":       {"", nextDueSQL, `'-infinity'`},
		"late-read":      {claimPlanSQL, lateSQL, `0, 50000`},
		"backlog-head":   {claimPlanSQL, backlogHeadSQL, `now() - interval '1 minute'`},
		"backlog-tail":   {claimPlanSQL, backlogTailSQL, `60000`},
	}
}

// DeadCountStatement is ReadStats's count of the DEAD rows (for the plan
// test).
func DeadCountStatement() string { return deadSQL }

// SetClock makes r read the time from now when it decides whether a claim
// reads the claim index from the front (scan.go).
func SetClock(r *Relay, now func() time.Time) {
	r.from.mu.Lock()
	defer r.from.mu.Unlock()
	r.from.now = now
}

// NextDue runs r's due-timer query: seconds until its earliest unsent row
// falls due.
func NextDue(ctx context.Context, r *Relay) (float64, error) {
	var secs float64
	err := r.nextDue(ctx, &secs)
	return secs, err
}

// ReadLate runs one of r's reads by id for rows committed late (late.go),
// as its poll does.
func ReadLate(ctx context.Context, r *Relay) { r.readLate(ctx) }

// LateRead is r's read by id as its next poll sends it: the planner
// settings and the statement, with its arguments (the floor and the
// limit); the floor is -1 while r does not know one yet.
func LateRead(r *Relay) (settings, sql string, args []any) {
	return claimPlanSQL, lateSQL, []any{r.late.floor, lateLimit}
}

// BacklogGauges returns the read of the backlog gauges (backlogReader),
// reading the part before its cutoff every every.
func BacklogGauges(db pgplan.Batcher, every time.Duration) func(context.Context) (Backlog, error) {
	r := &backlogReader{db: db, every: every}
	return r.read
}

// BacklogStatements are the planner settings of the gauges' reads, the
// read of the head ($1: the cutoff) and the read of every unsent row that
// ReadBacklog makes.
func BacklogStatements() (settings, head, all string) {
	return claimPlanSQL, backlogHeadSQL, backlogSQL
}
