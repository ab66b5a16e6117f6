// Package chaos is the reliability suite: it starts a throwaway PostgreSQL
// and redis-server, several worker processes (chaosworker, built from this
// directory), injects faults (SIGKILL and SIGSTOP of workers and relays,
// Redis data loss and freezes, a PostgreSQL restart, poison tasks and
// entries, long tasks under an aggressive reclaimer, transactions held
// open (idle in transaction and a REPEATABLE READ reader), a pipeline of dependent tasks under worker kills) and
// checks, once the system is quiet, the invariants:
//
//   - every task is SUCCEEDED or DEAD, XPENDING is empty, and the DLQ holds
//     exactly the DEAD tasks (plus the injected poison entries);
//   - each task's transitions form a valid path of the state machine with
//     exactly one terminal transition;
//   - the handlers' side-effect log (chaos_effect) shows every SUCCEEDED task
//     executed at least once, with no more duplicate executions than tasks
//     were in flight at the moments of the faults.
//
// The suite is behind the build tag reliability:
//
//	go test -race -tags reliability -count=1 ./internal/chaos/                     # short form (CI)
//	INGEST_CHAOS_LONG=1 go test -tags reliability -count=1 -timeout 60m ./internal/chaos/   # long form
//
// Timing bounds (a throughput ratio, a latency percentile) fail the long
// form only; the short form logs a missed one (timingBound).
//
// INGEST_CHAOS_REPORT=path writes the results table as Markdown.
package chaos
