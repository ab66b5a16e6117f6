package task

import "strings"

// The SQL fragments below are the task state machine's guards, each
// written once: every statement of this package that needs one (start,
// the rescuer's queries, the republish of deleted entries, outbox
// retention) splices it in. No SQL outside this package names a task state
// (docs/ARCHITECTURE.md §2).

// due is the guard of a waiting task (QUEUED or RETRYING) that may start:
// no next_retry_at, or one that has come. a is the alias of ingest_task.
func due(a string) string {
	return `(` + a + `.next_retry_at IS NULL OR ` + a + `.next_retry_at <= now())`
}

// expiredLease is the guard of a RUNNING task whose lease expired: its
// worker is taken for dead. a is the alias of ingest_task.
func expiredLease(a string) string {
	return a + `.status = 'RUNNING' AND ` + a + `.lease_until < now()`
}

// startable is the guard of a start (docs/ARCHITECTURE.md §2): a due
// QUEUED or RETRYING task, or a RUNNING one whose lease expired (a
// takeover). a is the alias of ingest_task; sep goes between the two arms
// (a line break and the indentation of the statement it is spliced into).
func startable(a, sep string) string {
	return `(` + a + `.status IN ` + waitingSQL + ` AND ` + due(a) + `)` + sep +
		`OR (` + expiredLease(a) + `)`
}

// terminalStates are the states no worker runs again; terminalSQL is the
// same list as SQL: ('SUCCEEDED', 'DEAD', 'CANCELLED').
var (
	terminalStates = []State{Succeeded, Dead, Cancelled}
	terminalSQL    = sqlList(terminalStates)
)

// waitingSQL lists the states of a task waiting to run: ('QUEUED',
// 'RETRYING').
var waitingSQL = sqlList([]State{Queued, Retrying})

// redrivableSQL lists the states an operator's redrive moves back to
// QUEUED: ('DEAD', 'CANCELLED').
var redrivableSQL = sqlList([]State{Dead, Cancelled})

// cancelRequested is the guard of a RUNNING task whose cancel was
// requested (Store.Cancel): whoever ends its run (its completion, or the
// takeover of its expired lease) moves it to CANCELLED instead. a is the
// alias of ingest_task.
func cancelRequested(a string) string {
	return a + `.cancel_requested_at IS NOT NULL`
}

// cancelMessage is the audit message of a move to CANCELLED: "cancelled"
// and the operator's reason. a is the alias of a row with the columns of
// ingest_task.
func cancelMessage(a string) string {
	return `'cancelled' || coalesce(': ' || ` + a + `.cancel_reason, '')`
}

// sqlList returns states as a parenthesised SQL list of literals.
func sqlList(states []State) string {
	q := make([]string, len(states))
	for i, s := range states {
		q[i] = `'` + string(s) + `'`
	}
	return `(` + strings.Join(q, ", ") + `)`
}
