package task

import "strings"

// The SQL fragments below are the task state machine's guards, each
// written once: every statement of this package that needs one (start,
// the rescuer's queries, the republish of deleted entries, outbox
// retention) splices it in. No SQL outside this package names a task state
// (docs/ARCHITECTURE.md §2).

// due is the guard of a waiting task (QUEUED or RETRYING) that may start:
// not parked, not held by its dependencies (waiting_for, deps.go), and no
// next_retry_at or one that has come. a is the alias of ingest_task.
func due(a string) string {
	return `(` + a + `.parked_at IS NULL AND ` + notHeld(a) + ` AND (` + a + `.next_retry_at IS NULL OR ` + a + `.next_retry_at <= now()))`
}

// notHeld is the guard of a task no edge holds (migration 00018): its
// waiting_for is NULL or 0. a is the alias of ingest_task.
func notHeld(a string) string {
	return `coalesce(` + a + `.waiting_for, 0) = 0`
}

// scheduled is the guard of a waiting task (QUEUED or RETRYING) due later:
// a delayed task, or a retry in its backoff (ListParams.Scheduled). a is
// the alias of ingest_task.
func scheduled(a string) string {
	return `(` + a + `.status IN ` + waitingSQL + ` AND ` + a + `.next_retry_at > now())`
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

// No index of ingest_task names a column that the start of a task changes,
// so that update can be HOT (migration 00012). Tasks are found by state
// through two partial indexes instead, whose guards follow; a query that
// looks for a state splices in its stateScope, so the planner can use
// the index.

// liveGuard holds the tasks that are not finished (QUEUED, RUNNING,
// RETRYING): ingest_task_live_idx. a is the alias of ingest_task.
func liveGuard(a string) string { return a + `.finished_at IS NULL` }

// failedGuard holds every task that failed at least once or was cancelled,
// among them every DEAD and every CANCELLED one (a CHECK constraint keeps
// it so): ingest_task_failed_idx. a is the alias of ingest_task.
func failedGuard(a string) string {
	return `(` + a + `.last_error IS NOT NULL OR ` + a + `.cancel_requested_at IS NOT NULL)`
}

// stateScope returns the guard of the partial index that holds every task
// in state s: liveGuard for the unfinished states, failedGuard for DEAD
// and CANCELLED, and true for SUCCEEDED (the common case: a scan of the
// primary key finds them densely).
func stateScope(a string, s State) string {
	switch s {
	case Queued, Running, Retrying:
		return liveGuard(a)
	case Dead, Cancelled:
		return failedGuard(a)
	}
	return `true`
}
