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

// No index of ingest_task names a column that the start or the completion
// of a task changes, so those updates can be HOT (migrations 00012 and
// 00025). Tasks are found by state through the sources and guards below;
// a query that looks for a state reads stateSource and splices in its
// stateScope, so the planner can use the index.

// lowWaterSQL is the low-water id (migration 00025): every unfinished
// task with an id below it is lingering. A reader whose snapshot predates
// a raise reads the lower one, and finds a superset of the tasks. The one
// row is read on its primary key: statements sent with sequential scans
// disabled (RescuePlanSQL, pgplan) would otherwise cost a scan of it at
// the penalty the setting adds, past the threshold of JIT compilation
// (seconds a statement).
const lowWaterSQL = `(SELECT lw.low FROM ingest_task_low_water lw WHERE lw.one)`

// liveTasks is a FROM item of the tasks that are not finished (QUEUED,
// RUNNING, RETRYING), with every column of ingest_task, aliased a: the
// recent ones (recentGuard: an id at or above the low water, not
// lingering) on the primary key, and the lingering ones (lingeringGuard)
// on ingest_task_lingering_idx, each read with finished_at IS NULL. The
// two arms are disjoint (lingering or not). A statement that must read
// them in id order a page at a time orders and limits each arm itself
// (rescueWindowSQL).
func liveTasks(a string) string {
	return `(SELECT * FROM ingest_task lr WHERE ` + recentGuard("lr") + `
    UNION ALL
    SELECT * FROM ingest_task ll WHERE ` + lingeringGuard("ll") + `) ` + a
}

// idAtSQL is the smallest UUIDv7 of the Unix millisecond given by the SQL
// bigint expression ms: every task created in that millisecond or later
// has an id at or above it (a task's id is a UUIDv7 of its creation time).
func idAtSQL(ms string) string {
	return `(lpad(to_hex(` + ms + `), 12, '0') || '00000000000000000000')::uuid`
}

// nowMinusMSSQL is the Unix millisecond of the database's now() minus the
// SQL bigint expression ms.
func nowMinusMSSQL(ms string) string {
	return `floor(extract(epoch FROM now() - ` + ms + ` * interval '1 millisecond') * 1000)::bigint`
}

// recentGuard holds the unfinished tasks at or above the low water that
// are not lingering (lingering is true or NULL): the first arm of
// liveTasks, a range of the primary key. a is the alias of ingest_task.
func recentGuard(a string) string {
	return a + `.id >= ` + lowWaterSQL + ` AND ` + a + `.lingering IS NULL AND ` + a + `.finished_at IS NULL`
}

// lingeringGuard holds the unfinished lingering tasks: the second arm of
// liveTasks, on ingest_task_lingering_idx. a is the alias of ingest_task.
func lingeringGuard(a string) string {
	return a + `.lingering AND ` + a + `.finished_at IS NULL`
}

// failedGuard holds every task that failed at least once or was cancelled,
// among them every DEAD and every CANCELLED one (a CHECK constraint keeps
// it so): ingest_task_failed_idx. a is the alias of ingest_task.
func failedGuard(a string) string {
	return `(` + a + `.last_error IS NOT NULL OR ` + a + `.cancel_requested_at IS NOT NULL)`
}

// stateSource returns the FROM item, aliased a, that holds every task in
// state s: liveTasks for the unfinished states, ingest_task for the
// others.
func stateSource(a string, s State) string {
	switch s {
	case Queued, Running, Retrying:
		return liveTasks(a)
	}
	return `ingest_task ` + a
}

// stateScope returns the guard of the partial index that holds every task
// in state s among those of its stateSource: failedGuard for DEAD and
// CANCELLED, and true for the others (SUCCEEDED: a scan of the primary
// key finds them densely; the unfinished states: liveTasks holds them).
func stateScope(a string, s State) string {
	switch s {
	case Dead, Cancelled:
		return failedGuard(a)
	}
	return `true`
}
