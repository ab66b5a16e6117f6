package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/pgplan"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/transition"
)

// StartResult is the outcome of Start for one id.
type StartResult struct {
	ID      uuid.UUID
	Outcome StartOutcome
	// Task is the row after the call (nil when NotFound, ParkedAtLimit or
	// Throttled). When Started or TakenOver it carries the payload and the
	// caller's lease.
	Task *Task
}

// startSQL starts every due task of $1 under lease owner $2 for $3 ms, and
// writes the audit row of each change, in one statement (one round trip,
// one implicit transaction).
//
// x is the ids in id order: the UPDATE changes their rows in that order (a
// nested loop over x, through the primary key), as the completions do, so
// concurrent batches take their row locks in one order. It takes no lock
// before it: the guard decides, on the target row (the guard of
// docs/ARCHITECTURE.md §2.2: a due QUEUED/RETRYING task, or a RUNNING one
// with an expired lease: a takeover, which counts the abandoned run as a
// failure and goes DEAD when it was the last attempt, or CANCELLED,
// uncounted, when a cancel had been requested; a task created without
// max_attempts has $5, this store's MaxAttempts), and Postgres re-checks
// it on the latest version of a row another transaction changed
// meanwhile. The SET list reads that same version, the one it replaces:
// so started_from = t.status keeps the state the start left, which the
// RETURNING list (which reads the new version) gives the audit row, and
// the takeover's error names the lease it took over. audit inserts one
// transition row per changed row.
//
// The guard is wrapped in CASE so that no plan uses it to scan a status
// index (see targetGuard). Rows it refuses come back unchanged with
// started = false, as the statement's snapshot holds them, and raced =
// true when that snapshot's row passes the guard: then another
// transaction changed the row after the statement began (another
// worker's start of the same task), and startInto sends the statement
// again for those ids, whose new snapshot sees the change (as a row lock
// before the update would have waited for it).
var startSQL = `
WITH x AS (
    SELECT x.id FROM unnest($1::uuid[]) AS x(id) ORDER BY x.id
), upd AS (
    UPDATE ingest_task t SET
        status        = CASE WHEN t.status = 'RUNNING' AND ` + cancelRequested("t") + ` THEN 'CANCELLED'
                             WHEN t.status = 'RUNNING' AND t.attempt_count + 1 >= coalesce(t.max_attempts, $5) THEN 'DEAD' ELSE 'RUNNING' END,
        attempt_count = t.attempt_count + CASE WHEN t.status = 'RUNNING' AND NOT ` + cancelRequested("t") + ` THEN 1 ELSE 0 END,
        lease_owner   = CASE WHEN t.status = 'RUNNING' AND (` + cancelRequested("t") + ` OR t.attempt_count + 1 >= coalesce(t.max_attempts, $5)) THEN NULL ELSE $2 END,
        lease_until   = CASE WHEN t.status = 'RUNNING' AND (` + cancelRequested("t") + ` OR t.attempt_count + 1 >= coalesce(t.max_attempts, $5)) THEN NULL
                             ELSE now() + $3 * interval '1 millisecond' END,
        finished_at   = CASE WHEN t.status = 'RUNNING' AND (` + cancelRequested("t") + ` OR t.attempt_count + 1 >= coalesce(t.max_attempts, $5)) THEN now() END,
        last_error    = CASE WHEN t.status = 'RUNNING' AND NOT ` + cancelRequested("t") + ` THEN left('lease of ' || t.lease_owner || ' expired: run abandoned', $4) ELSE t.last_error END,
        error_message = CASE WHEN t.status = 'RUNNING' AND NOT ` + cancelRequested("t") + ` THEN left('lease of ' || t.lease_owner || ' expired: run abandoned', $4) ELSE t.error_message END,
        next_retry_at = NULL,
        progress_percent = NULL, progress_message = NULL, progress_at = NULL,
        started_from  = t.status,
        updated_at    = now()
    FROM x
    WHERE t.id = x.id
      AND CASE WHEN ` + startable("t", "\n                 ") + ` THEN true ELSE false END
    RETURNING t.*
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, started_from, status, attempt_count,
           CASE WHEN status = 'CANCELLED' THEN ` + cancelMessage("upd") + `
                WHEN started_from = 'RUNNING' THEN NULLIF(last_error, '') ELSE 'attempt ' || (attempt_count + 1) END,
           CASE WHEN status = 'CANCELLED' THEN cancel_requested_by ELSE $2 END
    FROM upd
)
SELECT ` + taskColumns + `, started_from, true, false FROM upd
UNION ALL
SELECT ` + taskColumnsNoPayload + `, status, false, CASE WHEN ` + startable("r", " ") + ` THEN true ELSE false END
FROM (SELECT t.* FROM x JOIN ingest_task t ON t.id = x.id) r WHERE r.id NOT IN (SELECT id FROM upd)`

// Start moves each due task of ids to RUNNING under owner's lease and
// returns one result per distinct id, in the order given. All ids are
// started, and their audit rows written, by one statement, whose commit
// is flushed to the WAL before Start returns.
func (s *Store) Start(ctx context.Context, owner string, lease time.Duration, ids ...uuid.UUID) ([]StartResult, error) {
	return s.start(ctx, true, owner, lease, ids)
}

// StartUnflushed is Start whose commit does not wait for the WAL flush
// (synchronous_commit off for the statement's implicit transaction, sent
// in the same round trip): the worker's start of the tasks it reads. Its
// starts are visible at once, but a crash of PostgreSQL within the WAL
// writer's delay may undo them: each task is then as it was before, its
// message still pending, and runs again (docs/ARCHITECTURE.md §2.4, "An
// unflushed start"). The run's completion, which commits durably, flushes
// its start with it. A start that ends its task (DiedOnTakeover,
// CancelledOnTakeover), which the caller acts on in the queue (a DLQ
// entry, an acknowledgement), is flushed before StartUnflushed returns.
func (s *Store) StartUnflushed(ctx context.Context, owner string, lease time.Duration, ids ...uuid.UUID) ([]StartResult, error) {
	return s.start(ctx, false, owner, lease, ids)
}

func (s *Store) start(ctx context.Context, durable bool, owner string, lease time.Duration, ids []uuid.UUID) ([]StartResult, error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	byID := make(map[uuid.UUID]StartResult, len(ids))
	err := s.retry(ctx, func() error {
		clear(byID)
		// The statement's implicit transaction has committed once its
		// rows are read without error.
		return s.startInto(ctx, s.db, durable, owner, lease, ids, byID)
	})
	if err != nil {
		return nil, fmt.Errorf("start %d tasks: %w", len(ids), err)
	}
	out := make([]StartResult, len(ids))
	var ended []uuid.UUID
	for i, id := range ids {
		r, ok := byID[id]
		if !ok {
			r = StartResult{ID: id, Outcome: NotFound}
		}
		if r.Outcome == DiedOnTakeover || r.Outcome == CancelledOnTakeover {
			ended = append(ended, id)
		}
		out[i] = r
	}
	if !durable && len(ended) > 0 {
		if err := s.flushWAL(ctx, ended); err != nil {
			return nil, fmt.Errorf("start %d tasks: flush the takeovers that ended tasks: %w", len(ids), err)
		}
	}
	return out, nil
}

// flushWALSQL locks the rows of $1 (FOR KEY SHARE: it blocks no update
// of their columns) and so writes WAL: its commit, under the session's
// synchronous_commit (on unless configured otherwise), returns once the
// WAL is flushed up to its commit record, and so past every commit before
// it, an unflushed one included. (A transaction that writes no WAL, a bare
// txid_current() for one, commits without a flush.)
const flushWALSQL = `SELECT id FROM ingest_task WHERE id = ANY($1) FOR KEY SHARE`

// flushWAL returns once every commit before it, the changes of ids
// included, is flushed to the WAL.
func (s *Store) flushWAL(ctx context.Context, ids []uuid.UUID) error {
	_, err := pgplan.Exec(ctx, s.db, flushWALSQL, ids)
	return err
}

// startInto runs startSQL for ids on q and records each row's result in
// byID (ids without a row are left out), sending it again for the ids
// that raced (startOnce). Unless durable, the statement's
// transaction commits without waiting for the WAL flush (StartUnflushed).
func (s *Store) startInto(ctx context.Context, q DB, durable bool, owner string, lease time.Duration, ids []uuid.UUID, byID map[uuid.UUID]StartResult) error {
	send := pgplan.Query
	if !durable {
		send = pgplan.QueryUnflushed
	}
	for range maxStartRaces {
		raced, err := s.startOnce(ctx, q, send, owner, lease, ids, byID)
		if err != nil || len(raced) == 0 {
			return err
		}
		ids = raced
	}
	return nil
}

// maxStartRaces bounds how many times startInto sends the start of ids
// that raced with another transaction (see startSQL); past it they keep
// the outcome their last snapshot gave.
const maxStartRaces = 3

// startOnce runs startSQL for ids once, records each row's result in
// byID, and returns the ids whose row changed under the statement
// (raced: their results are those of the statement's snapshot).
func (s *Store) startOnce(ctx context.Context, q DB, send func(context.Context, pgplan.Batcher, string, ...any) (pgx.Rows, error),
	owner string, lease time.Duration, ids []uuid.UUID, byID map[uuid.UUID]StartResult) ([]uuid.UUID, error) {
	rows, err := send(ctx, q, startSQL, ids, owner, lease.Milliseconds(), MaxErrorBytes/4, s.cfg.MaxAttempts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var raced []uuid.UUID
	var from State
	var started, race bool
	sc := newTaskScanner(&from, &started, &race)
	for rows.Next() {
		t, err := sc.scan(rows)
		if err != nil {
			return nil, err
		}
		if race {
			raced = append(raced, t.ID)
		}
		r := StartResult{ID: t.ID, Task: &t}
		switch {
		case started && from == Running && t.Status == Dead:
			r.Outcome = DiedOnTakeover
		case started && from == Running && t.Status == Cancelled:
			r.Outcome = CancelledOnTakeover
		case started && from == Running:
			r.Outcome = TakenOver
		case started:
			r.Outcome = Started
		case from == Queued || from == Retrying:
			r.Outcome = waitingOutcome(&t)
		case from == Running:
			r.Outcome = LeaseHeld
		default:
			r.Outcome = Finished
		}
		if r.Outcome != Started && r.Outcome != TakenOver {
			t.Payload = nil
		} else {
			s.openPayload(&t)
		}
		byID[t.ID] = r
	}
	return raced, rows.Err()
}

// Result is the outcome of a guarded transition for one id.
type Result struct {
	ID uuid.UUID
	// Applied is false when the guard did not match (the caller lost its
	// lease, the task is in another state, or it does not exist): nothing
	// changed.
	Applied bool
	// Status is the task's status after the call ("" when it does not
	// exist).
	Status State
	// AttemptCount is the task's attempt_count after the call.
	AttemptCount int
	// NextRetryAt is when a RETRYING task falls due.
	NextRetryAt *time.Time
	// LastError is the stored (truncated) error of a failed task.
	LastError string
	// LeaseOwner is the current lease owner (for reporting conflicts).
	LeaseOwner string
	// FinishedAt is when a SUCCEEDED, DEAD or CANCELLED task finished;
	// with the id it identifies one death of a task (a redriven task can
	// die again).
	FinishedAt *time.Time
	// From is the status before the call, for an applied redrive.
	From State
	// Ended is, for an applied redrive, when the task had finished: with
	// the id it names the end the redrive undid (a DLQ entry of that
	// death goes; one of a death after the redrive is another's).
	Ended *time.Time
}

var renewSQL = `
WITH l AS (` + runningIDs + `
)
UPDATE ingest_task t SET lease_until = now() + $3 * interval '1 millisecond', updated_at = now()
FROM l WHERE t.id = l.id AND ` + targetGuard + `
RETURNING t.id, ` + cancelRequested("t")

// Renew extends owner's lease on the RUNNING tasks of ids and returns the
// ids whose lease it renewed (the others were lost: taken over or
// finished) and, among them, those whose cancel was requested (Cancel):
// their handlers are to be cancelled. A renewal is no state change and
// writes no audit row.
func (s *Store) Renew(ctx context.Context, owner string, lease time.Duration, ids ...uuid.UUID) (renewed, cancel []uuid.UUID, err error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil, nil
	}
	rows, err := pgplan.Query(ctx, s.db, renewSQL, ids, owner, lease.Milliseconds())
	if err != nil {
		return nil, nil, fmt.Errorf("renew %d leases: %w", len(ids), err)
	}
	var id uuid.UUID
	var cancelled bool
	_, err = pgx.ForEachRow(rows, []any{&id, &cancelled}, func() error {
		renewed = append(renewed, id)
		if cancelled {
			cancel = append(cancel, id)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("renew %d leases: %w", len(ids), err)
	}
	return renewed, cancel, nil
}

// The completion statements below each change the rows of $1 that owner
// $2 holds RUNNING and write one audit row per change: one statement, one
// round trip, one implicit transaction. The rows are updated in id order
// and found through the primary key alone (runningIDs).

// guardedTail returns the rows cte u changed. The current state of the
// others is read afterwards, by a statement of its own (see
// guardedStatement), so a row another transaction was changing is read
// in the version it committed.
const guardedTail = `
SELECT id, status, attempt_count, next_retry_at, last_error, finished_at FROM u`

// currentSQL reads the current state of tasks a guard refused.
const currentSQL = `
SELECT t.id, t.status, t.attempt_count, t.next_retry_at, coalesce(t.last_error, ''), coalesce(t.lease_owner, ''), t.finished_at
FROM unnest($1::uuid[]) AS x(id) JOIN ingest_task t ON t.id = x.id`

// runningIDs are the ids of $1 in id order: the completions below update
// their rows in that order (a nested loop over it, through the primary
// key), so concurrent batches take their row locks in one order. They
// take no lock before the update: a lock is a WAL record of its own, and
// a completion needs nothing of the row's previous version but what its
// guard checks, which Postgres re-checks on the latest version of a row
// that changed meanwhile (and the SET reads that version too).
const runningIDs = `
    SELECT x.id FROM unnest($1::uuid[]) AS x(id) ORDER BY x.id`

// targetGuard is a completion's guard on the UPDATE's target row t: held
// by owner $2 RUNNING. Postgres re-checks it on the row's latest version.
// It is a CASE, not a plain qual: the planner cannot match a CASE to an
// index, so no plan reads the target rows from an index of their state
// (an index on status once made that a scan of every RUNNING task per
// statement with stale statistics: 10 s for 170 ids among 200,000 RUNNING
// tasks). The rows come through the primary key, joined to l.
const targetGuard = `CASE WHEN t.status = 'RUNNING' AND t.lease_owner = $2 THEN true ELSE false END`

// guardedReturning is the RETURNING list of u.
// cancel_reason and cancel_requested_by feed the audit row of a
// completion that a cancel request turned into CANCELLED.
const guardedReturning = `RETURNING t.id, t.status, t.attempt_count, t.next_retry_at, coalesce(t.last_error, '') AS last_error, t.finished_at,
        t.cancel_reason, t.cancel_requested_by`

// The completions below end a run whose cancel was requested (Cancel) in
// CANCELLED, whatever the handler returned: the request committed first,
// and the caller was told the task is being cancelled. The audit row then
// carries the cancel's reason and its actor as the worker.
var (
	// cancelAuditMessage is the audit message of a completion of u that
	// went CANCELLED (NULL for the others).
	cancelAuditMessage = `CASE WHEN u.status = 'CANCELLED' THEN ` + cancelMessage("u") + ` END`
	// cancelAuditWorker is the audit worker of a completion of u: the
	// cancel's actor for CANCELLED, else the lease owner $2.
	cancelAuditWorker = `CASE WHEN u.status = 'CANCELLED' THEN u.cancel_requested_by ELSE $2 END`
)

// succeedSQL records successes; $3 holds their results, parallel to $1
// (NULL, or a NULL element: none), written in the same statement. Its l
// is runningIDs with the results alongside.
var succeedSQL = `
WITH l AS (
    SELECT x.id, x.result FROM unnest($1::uuid[], $3::text[]) AS x(id, result) ORDER BY x.id
), u AS (
    UPDATE ingest_task t SET status = CASE WHEN ` + cancelRequested("t") + ` THEN 'CANCELLED' ELSE 'SUCCEEDED' END,
        result = CASE WHEN ` + cancelRequested("t") + ` THEN NULL ELSE l.result::jsonb END,
        lease_owner = NULL, lease_until = NULL, next_retry_at = NULL, finished_at = now(), updated_at = now()
    FROM l WHERE t.id = l.id AND ` + targetGuard + `
    ` + guardedReturning + `
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, 'RUNNING', status, attempt_count, ` + cancelAuditMessage + `, ` + cancelAuditWorker + ` FROM u
)` + guardedTail

// Succeed moves the tasks of ids that owner holds RUNNING to SUCCEEDED (to
// CANCELLED if their cancel was requested), without results.
func (s *Store) Succeed(ctx context.Context, owner string, ids ...uuid.UUID) ([]Result, error) {
	ids = distinct(ids)
	return s.guardedStatement(ctx, "succeed", ids, succeedSQL, ids, owner, nil)
}

// Success is one successful run and its result.
type Success struct {
	ID uuid.UUID
	// Result is stored with the task (nil: none); the caller has checked
	// it (CheckResult).
	Result json.RawMessage
}

// SucceedWith is Succeed with each task's result, written by the same
// statement. A task given twice keeps its first result.
func (s *Store) SucceedWith(ctx context.Context, owner string, succ ...Success) ([]Result, error) {
	ids := make([]uuid.UUID, 0, len(succ))
	var results []*string // nil: no task has a result
	seen := make(map[uuid.UUID]bool, len(succ))
	for _, x := range succ {
		if seen[x.ID] {
			continue
		}
		seen[x.ID] = true
		ids = append(ids, x.ID)
		if x.Result != nil && results == nil {
			results = make([]*string, len(ids)-1, len(succ))
		}
		if results != nil {
			var r *string
			if x.Result != nil {
				sealed, err := s.cfg.Keyring.Seal(seal.Result, x.ID, x.Result)
				if err != nil {
					return nil, err
				}
				v := string(sealed)
				r = &v
			}
			results = append(results, r)
		}
	}
	return s.guardedStatement(ctx, "succeed", ids, succeedSQL, ids, owner, results)
}

// Failure describes one failed run.
type Failure struct {
	ID    uuid.UUID
	Error string
	// Permanent sends the task to DEAD at once.
	Permanent bool
	// RetryAfter, when > 0, replaces the backoff delay.
	RetryAfter time.Duration
}

// failSQL records failed runs. Inputs are parallel arrays: id, error,
// permanent, retry-after µs (0: use the backoff), audit message. RETRYING
// or DEAD is decided here from the row's attempt_count; the backoff is
// package backoff's delay after attempt_count + 1 failures, with base $3
// and max $4 in (fractional) ms and jitter $5. A task created without
// max_attempts has $10, the failing store's MaxAttempts (so the workers'
// INGEST_REDIS_MAX_ATTEMPTS governs it). DEAD clears next_retry_at.
// failEnds is true in failSQL for a failure that ends the task (DEAD, or
// CANCELLED): its progress is kept; a retry's is cleared.
var failEnds = cancelRequested("t") + ` OR f.permanent OR t.attempt_count + 1 >= coalesce(t.max_attempts, $10)`

var failSQL = `
WITH f AS (
    SELECT * FROM unnest($1::uuid[], $6::text[], $7::bool[], $8::bigint[], $9::text[]) AS f(id, err, permanent, retry_after_us, msg)
), l AS (` + runningIDs + `
), u AS (
    UPDATE ingest_task t SET
        attempt_count = t.attempt_count + CASE WHEN ` + cancelRequested("t") + ` THEN 0 ELSE 1 END,
        status        = CASE WHEN ` + cancelRequested("t") + ` THEN 'CANCELLED'
                             WHEN f.permanent OR t.attempt_count + 1 >= coalesce(t.max_attempts, $10) THEN 'DEAD' ELSE 'RETRYING' END,
        next_retry_at = CASE WHEN ` + cancelRequested("t") + ` OR f.permanent OR t.attempt_count + 1 >= coalesce(t.max_attempts, $10) THEN NULL
                             WHEN f.retry_after_us > 0 THEN now() + f.retry_after_us * interval '1 microsecond'
                             ELSE now() + ` + backoff.SQL("t.attempt_count + 1", "$3", "$4", "$5", "random()") + ` END,
        finished_at   = CASE WHEN ` + cancelRequested("t") + ` OR f.permanent OR t.attempt_count + 1 >= coalesce(t.max_attempts, $10) THEN now() END,
        last_error    = CASE WHEN ` + cancelRequested("t") + ` THEN t.last_error ELSE f.err END,
        error_message = CASE WHEN ` + cancelRequested("t") + ` THEN t.error_message ELSE f.err END,
        lease_owner   = NULL,
        lease_until   = NULL,
        progress_percent = CASE WHEN ` + failEnds + ` THEN t.progress_percent END,
        progress_at      = CASE WHEN ` + failEnds + ` THEN t.progress_at END,
        progress_message = CASE WHEN ` + failEnds + ` THEN t.progress_message END,
        updated_at    = now()
    FROM f, l
    WHERE t.id = f.id AND t.id = l.id AND ` + targetGuard + `
    ` + guardedReturning + `
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT u.id, 'RUNNING', u.status, u.attempt_count, coalesce(` + cancelAuditMessage + `, NULLIF(f.msg, '')), ` + cancelAuditWorker + `
    FROM u JOIN f ON f.id = u.id
)` + guardedTail

// Fail records failed runs of tasks that owner holds RUNNING: each goes
// RETRYING (due after the backoff, or RetryAfter) while attempts remain, and
// DEAD when they are exhausted or the failure is permanent. A run whose
// cancel was requested goes CANCELLED instead, not counted as a failure and
// its error not stored (it is usually the cancelled context's).
func (s *Store) Fail(ctx context.Context, owner string, fails ...Failure) ([]Result, error) {
	seen := map[uuid.UUID]bool{}
	var ids []uuid.UUID
	var errs, msgs []string
	var perm []bool
	var after []int64
	for _, f := range fails {
		if seen[f.ID] {
			continue
		}
		seen[f.ID] = true
		f.Error = truncateError(f.Error)
		msg := f.Error
		if f.Permanent {
			msg = truncateError("permanent: " + msg)
		}
		ids = append(ids, f.ID)
		errs = append(errs, f.Error)
		msgs = append(msgs, msg)
		perm = append(perm, f.Permanent)
		after = append(after, f.RetryAfter.Microseconds())
	}
	baseMS, maxMS, jitter := s.cfg.Backoff.SQLArgs()
	return s.guardedStatement(ctx, "fail", ids, failSQL, ids, owner, baseMS, maxMS, jitter, errs, perm, after, msgs, s.cfg.MaxAttempts)
}

// handBackSQL is Release's statement: owner's RUNNING tasks go back to
// RETRYING, due at once, their audit rows saying $3 (not to be confused
// with ReleaseParked, which wakes parked tasks).
var handBackSQL = `
WITH l AS (` + runningIDs + `
), u AS (
    UPDATE ingest_task t SET status = CASE WHEN ` + cancelRequested("t") + ` THEN 'CANCELLED' ELSE 'RETRYING' END,
        next_retry_at = CASE WHEN ` + cancelRequested("t") + ` THEN NULL ELSE now() END,
        finished_at = CASE WHEN ` + cancelRequested("t") + ` THEN now() END,
        progress_percent = NULL, progress_message = NULL, progress_at = NULL,
        lease_owner = NULL, lease_until = NULL, updated_at = now()
    FROM l WHERE t.id = l.id AND ` + targetGuard + `
    ` + guardedReturning + `
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, 'RUNNING', status, attempt_count, coalesce(` + cancelAuditMessage + `, $3::text), ` + cancelAuditWorker + ` FROM u
)` + guardedTail

// Release hands back tasks that owner holds RUNNING without counting a
// failure (graceful shutdown): they go RETRYING, due at once (CANCELLED if
// their cancel was requested).
func (s *Store) Release(ctx context.Context, owner string, ids ...uuid.UUID) ([]Result, error) {
	return s.release(ctx, owner, "released at shutdown", ids)
}

// ReleaseUnrun hands back, as Release does, tasks that owner started but
// did not run: they waited for a handler slot while their leases went
// unrenewed, and the renewal that was to confirm them failed.
func (s *Store) ReleaseUnrun(ctx context.Context, owner string, ids ...uuid.UUID) ([]Result, error) {
	return s.release(ctx, owner, ReleasedUnrun, ids)
}

// ReleasedUnrun is the audit message of a ReleaseUnrun.
const ReleasedUnrun = "released unrun: its lease could not be confirmed after a wait for a handler slot"

func (s *Store) release(ctx context.Context, owner, message string, ids []uuid.UUID) ([]Result, error) {
	ids = distinct(ids)
	return s.guardedStatement(ctx, "release", ids, handBackSQL, ids, owner, message)
}

// redriveSQL moves DEAD and CANCELLED tasks back to QUEUED. An unfinished
// task again, it is made lingering: its id may be below the low water,
// and the lingering tasks are found whatever their id (liveTasks). A task
// with a group is due now by its next_retry_at, as a delayed task fallen
// due is, so that the relay holds it to its group's window
// (ingest_task_hold_due, group.go): a bulk redrive of one group's dead
// tasks takes its turn with the other groups' work.
var redriveSQL = `
UPDATE ingest_task t SET status = 'QUEUED', attempt_count = 0, next_retry_at = CASE WHEN t.group_key IS NOT NULL THEN now() END,
    due_at = now(), finished_at = NULL, lingering = true,
    lease_owner = NULL, lease_until = NULL, cancel_requested_at = NULL, cancel_reason = NULL, cancel_requested_by = NULL,
    progress_percent = NULL, progress_message = NULL, progress_at = NULL, updated_at = now()
FROM (SELECT id, status, finished_at FROM ingest_task WHERE id = ANY($1::uuid[])
      AND CASE WHEN status IN ` + redrivableSQL + ` THEN true ELSE false END ORDER BY id FOR NO KEY UPDATE) l
WHERE t.id = l.id AND CASE WHEN t.status IN ` + redrivableSQL + ` THEN true ELSE false END
RETURNING t.id, t.status, t.attempt_count, t.next_retry_at, coalesce(t.last_error, ''), '', t.finished_at, l.status, l.finished_at`

// republishWaitingSQL gives a new outbox row (to stream $2) to each task
// of $1 that still waits to run and whose latest outbox row is DEAD: the
// relay gave up publishing it (the queue was unreachable for all its
// attempts), so the task never reached a worker. The caller holds the row
// locks.
var republishWaitingSQL = `
INSERT INTO outbox_row (task_id, stream)
SELECT t.id, $2
FROM ingest_task t
JOIN LATERAL (SELECT o.status FROM outbox_event o WHERE o.task_id = t.id ORDER BY o.id DESC LIMIT 1) last ON true
WHERE t.id = ANY($1::uuid[]) AND t.status IN ` + waitingSQL + ` AND last.status = 'DEAD'
RETURNING task_id`

// republishWaiting runs republishWaitingSQL in tx and returns the tasks it
// gave a new outbox row.
func republishWaiting(ctx context.Context, tx pgx.Tx, stream string, ids []uuid.UUID) ([]uuid.UUID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, republishWaitingSQL, ids, stream)
	if err != nil {
		return nil, fmt.Errorf("republish %d waiting tasks: %w", len(ids), err)
	}
	ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("republish waiting tasks: %w", err)
	}
	return ids, nil
}

// Redrive moves DEAD and CANCELLED tasks back to QUEUED with their
// attempts reset and their cancel request cleared (the audit trail keeps
// the history), due now (due_at = now(): a redrive starts a new life,
// whose latency runs from it) and a new outbox event, in one transaction. actor is
// recorded as the transition's worker.
//
// A QUEUED or RETRYING task whose latest outbox event is DEAD (publishing
// gave up while the queue was unreachable, so the task never reached a
// worker) is redriven too: it gets a new outbox event and keeps its state
// (Applied, no transition).
func (s *Store) Redrive(ctx context.Context, actor string, ids ...uuid.UUID) ([]Result, error) {
	var res []Result
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		res, err = s.RedriveTx(ctx, tx, actor, ids...)
		return err
	})
	return res, err
}

// RedriveTx is Redrive inside the caller's transaction.
func (s *Store) RedriveTx(ctx context.Context, tx pgx.Tx, actor string, ids ...uuid.UUID) ([]Result, error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	// The republish below reads outbox_event before it writes it
	// (outbox.LockForWrite). Every row is locked first, in id order, as
	// every other statement of this package locks: the redrive and the
	// republish below lock two subsets one after the other, which alone
	// could deadlock with them.
	if err := outbox.LockForWrite(ctx, tx); err != nil {
		return nil, fmt.Errorf("redrive: %w", err)
	}
	if _, err := tx.Exec(ctx, lockTasksSQL, ids); err != nil {
		return nil, fmt.Errorf("redrive: %w", err)
	}
	res, err := s.guardedTx(ctx, tx, ids, func(tx pgx.Tx) (pgx.Rows, error) {
		return tx.Query(ctx, redriveSQL, ids)
	}, func(r Result) transition.Record {
		return transition.Record{TaskID: r.ID, From: string(r.From), To: string(Queued), AttemptCount: 0, Worker: actor, Message: "redrive"}
	})
	if err != nil {
		return nil, fmt.Errorf("redrive: %w", err)
	}
	var applied, waiting []uuid.UUID
	for _, r := range res {
		switch {
		case r.Applied:
			applied = append(applied, r.ID)
		case r.Status == Queued || r.Status == Retrying:
			waiting = append(waiting, r.ID)
		}
	}
	if err := outbox.Insert(ctx, tx, s.cfg.Stream, applied...); err != nil {
		return nil, err
	}
	republished, err := republishWaiting(ctx, tx, s.cfg.Stream, waiting)
	if err != nil {
		return nil, err
	}
	for _, id := range republished {
		for i := range res {
			if res[i].ID == id {
				res[i].Applied = true
			}
		}
	}
	return res, nil
}

// guardedStatement runs one of the completion statements above and
// returns one Result per id, in order.
func (s *Store) guardedStatement(ctx context.Context, op string, ids []uuid.UUID, sql string, args ...any) ([]Result, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	byID := make(map[uuid.UUID]Result, len(ids))
	out := s.ownWriter()
	wake := out.Wakes()
	var due bool
	err := s.retry(ctx, func() error {
		clear(byID)
		var err error
		due, err = guardedBatch(ctx, s.db, wake, sql, args, func(rows pgx.Rows) error {
			for rows.Next() {
				r := Result{Applied: true}
				if err := rows.Scan(&r.ID, &r.Status, &r.AttemptCount, &r.NextRetryAt, &r.LastError, &r.FinishedAt); err != nil {
					return err
				}
				byID[r.ID] = r
			}
			return nil
		})
		return err
	})
	if due {
		// Rows to publish (a window refilled, a dependent freed) that
		// sent no NOTIFY: this process's relay publishes them.
		out.Wake()
	}
	var res []Result
	if err == nil {
		// Read with a fresh snapshot, after the statement committed.
		res, err = withRefused(ctx, s.db, ids, byID)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %d tasks: %w", op, len(ids), err)
	}
	return res, nil
}

// guardedBatch sends sql (args) after pgplan.Settings in one round trip
// and one implicit transaction, as pgplan.Query does, and hands its rows
// to scan (which need not check rows.Err: guardedBatch does); the
// transaction has committed once it returns without error.
// With wake (the store's own writer has a running relay: Writer.Wakes),
// the rows the statement's triggers write to the outbox (a group's window
// refilled, a dependent task freed) send no NOTIFY (outbox.WakeByCaller),
// which would serialize this commit with every other notifying commit of
// the server, and due reports whether there are any: the caller then
// wakes its relay.
func guardedBatch(ctx context.Context, db pgplan.Batcher, wake bool, sql string, args []any, scan func(pgx.Rows) error) (due bool, err error) {
	b := &pgx.Batch{}
	if wake {
		b.Queue(pgplan.Settings + ", " + outbox.WakeByCaller)
	} else {
		b.Queue(pgplan.Settings)
	}
	b.Queue(sql, args...)
	if wake {
		b.Queue(outbox.WakeDueSQL)
	}
	br := db.SendBatch(ctx, b)
	if _, err = br.Exec(); err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			err = scan(rows)
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	}
	if err == nil && wake {
		err = br.QueryRow().Scan(&due)
	}
	return due, errors.Join(err, br.Close())
}

// withRefused returns one Result per id, in order: the applied ones of
// byID, and for the ids a guard refused (rare: a lost lease, a race) their
// current state, read through q.
func withRefused(ctx context.Context, q pgplan.Batcher, ids []uuid.UUID, byID map[uuid.UUID]Result) ([]Result, error) {
	if len(byID) < len(ids) {
		var refused []uuid.UUID
		for _, id := range ids {
			if _, ok := byID[id]; !ok {
				refused = append(refused, id)
			}
		}
		rows, err := pgplan.Query(ctx, q, currentSQL, refused)
		if err != nil {
			return nil, err
		}
		current, err := pgx.CollectRows(rows, scanResult)
		if err != nil {
			return nil, err
		}
		for _, r := range current {
			byID[r.ID] = r
		}
	}
	out := make([]Result, len(ids))
	for i, id := range ids {
		r, ok := byID[id]
		if !ok {
			r = Result{ID: id}
		}
		out[i] = r
	}
	return out, nil
}

func (s *Store) guardedTx(ctx context.Context, tx pgx.Tx, ids []uuid.UUID, query func(pgx.Tx) (pgx.Rows, error), rec func(Result) transition.Record) ([]Result, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := query(tx)
	if err != nil {
		return nil, err
	}
	applied, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Result, error) {
		var r Result
		err := row.Scan(&r.ID, &r.Status, &r.AttemptCount, &r.NextRetryAt, &r.LastError, &r.LeaseOwner, &r.FinishedAt, &r.From, &r.Ended)
		return r, err
	})
	if err != nil {
		return nil, err
	}
	byID := make(map[uuid.UUID]Result, len(ids))
	recs := make([]transition.Record, 0, len(applied))
	for _, r := range applied {
		r.Applied = true
		byID[r.ID] = r
		recs = append(recs, rec(r))
	}
	if err := transition.Insert(ctx, tx, recs...); err != nil {
		return nil, err
	}
	return withRefused(ctx, tx, ids, byID)
}

func scanResult(row pgx.CollectableRow) (Result, error) {
	var r Result
	err := row.Scan(&r.ID, &r.Status, &r.AttemptCount, &r.NextRetryAt, &r.LastError, &r.LeaseOwner, &r.FinishedAt)
	return r, err
}

// distinct returns ids without repeats, in their first order.
func distinct(ids []uuid.UUID) []uuid.UUID {
	if len(ids) < 2 {
		return ids
	}
	seen := make(map[uuid.UUID]struct{}, len(ids))
	out := make([]uuid.UUID, 0, len(ids))
	for _, id := range ids {
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			out = append(out, id)
		}
	}
	return out
}
