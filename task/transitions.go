package task

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/transition"
)

// StartResult is the outcome of Start for one id.
type StartResult struct {
	ID      uuid.UUID
	Outcome StartOutcome
	// Task is the row after the call (nil when NotFound). When Started it
	// carries the payload and the caller's lease.
	Task *Task
	// TookOver is set when the task was RUNNING under an expired lease: the
	// abandoned run was counted as a failed attempt.
	TookOver bool
	// Died is set when that takeover used up the last attempt: this call
	// moved the task to DEAD (Outcome is Skipped) and the caller should
	// dead-letter its stream entry.
	Died bool
}

// startSQL starts every due task of $1 under lease owner $2 for $3 ms, and
// writes the audit row of each change, in one statement (one round trip,
// one implicit transaction).
//
// locked takes the row locks in id order and, being FOR NO KEY UPDATE,
// reads the latest committed version of each row (the ids are joined from
// unnest, so the rows are found through the primary key alone, whatever
// the other indexes hold). The UPDATE's WHERE is the guard of DESIGN §2,
// on locked's columns (see lockRunning)
// (due QUEUED/RETRYING, or RUNNING with an expired lease: a takeover, which
// counts the abandoned run as a failure and goes DEAD when it was the last
// attempt). audit inserts one transition row per changed row. Rows the
// guard refuses come back unchanged with started = false.
const startSQL = `
WITH locked AS (
    SELECT t.* FROM unnest($1::uuid[]) AS x(id) JOIN ingest_task t ON t.id = x.id
    ORDER BY t.id FOR NO KEY UPDATE OF t
), upd AS (
    UPDATE ingest_task t SET
        status        = CASE WHEN l.status = 'RUNNING' AND t.attempt_count + 1 >= t.max_attempts THEN 'DEAD' ELSE 'RUNNING' END,
        attempt_count = t.attempt_count + CASE WHEN l.status = 'RUNNING' THEN 1 ELSE 0 END,
        lease_owner   = CASE WHEN l.status = 'RUNNING' AND t.attempt_count + 1 >= t.max_attempts THEN NULL ELSE $2 END,
        lease_until   = CASE WHEN l.status = 'RUNNING' AND t.attempt_count + 1 >= t.max_attempts THEN NULL
                             ELSE now() + $3 * interval '1 millisecond' END,
        finished_at   = CASE WHEN l.status = 'RUNNING' AND t.attempt_count + 1 >= t.max_attempts THEN now() END,
        last_error    = CASE WHEN l.status = 'RUNNING' THEN left('lease of ' || l.lease_owner || ' expired: run abandoned', $4) ELSE t.last_error END,
        error_message = CASE WHEN l.status = 'RUNNING' THEN left('lease of ' || l.lease_owner || ' expired: run abandoned', $4) ELSE t.error_message END,
        next_retry_at = NULL,
        updated_at    = now()
    FROM locked l
    WHERE t.id = l.id AND (
           (l.status IN ('QUEUED', 'RETRYING') AND (l.next_retry_at IS NULL OR l.next_retry_at <= now()))
        OR (l.status = 'RUNNING' AND l.lease_until < now()))
      -- The same guard on the target row: re-checked by Postgres on the
      -- row's latest version, so a version older than the locked one is
      -- never written (the SET reads t). Wrapped in CASE so that no plan
      -- uses it to scan a status index (see targetGuard).
      AND CASE WHEN (t.status IN ('QUEUED', 'RETRYING') AND (t.next_retry_at IS NULL OR t.next_retry_at <= now()))
                 OR (t.status = 'RUNNING' AND t.lease_until < now()) THEN true ELSE false END
    RETURNING t.*, l.status AS from_status, coalesce(l.lease_owner, '') AS prev_owner
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, from_status, status, attempt_count,
           CASE WHEN from_status = 'RUNNING' THEN NULLIF(last_error, '') ELSE 'attempt ' || (attempt_count + 1) END, $2
    FROM upd
)
SELECT ` + taskColumns + `, from_status, prev_owner, true FROM upd
UNION ALL
SELECT ` + taskColumns + `, status, '', false
FROM locked WHERE id NOT IN (SELECT id FROM upd)`

// Start moves each due task of ids to RUNNING under owner's lease and
// returns one result per distinct id, in the order given. All ids are
// started, and their audit rows written, by one statement.
func (s *Store) Start(ctx context.Context, owner string, lease time.Duration, ids ...uuid.UUID) ([]StartResult, error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	byID := make(map[uuid.UUID]StartResult, len(ids))
	err := s.retry(ctx, func() error {
		clear(byID)
		rows, err := s.db.Query(ctx, startSQL, ids, owner, lease.Milliseconds(), MaxErrorBytes/4)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var from State
			var prevOwner string
			var started bool
			t, err := scanTask(rows, &from, &prevOwner, &started)
			if err != nil {
				return err
			}
			r := StartResult{ID: t.ID, Task: &t}
			switch {
			case started && from == Running:
				r.TookOver = true
				r.Died = t.Status == Dead
				r.Outcome = Started
				if r.Died {
					r.Outcome = Skipped
				}
			case started:
				r.Outcome = Started
			case from == Queued || from == Retrying:
				r.Outcome = NotDue
			default:
				r.Outcome = Skipped
			}
			if r.Outcome != Started {
				t.Payload = nil
			}
			byID[t.ID] = r
		}
		// The statement's implicit transaction has committed once the
		// rows are read without error.
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("start %d tasks: %w", len(ids), err)
	}
	out := make([]StartResult, len(ids))
	for i, id := range ids {
		r, ok := byID[id]
		if !ok {
			r = StartResult{ID: id, Outcome: NotFound}
		}
		out[i] = r
	}
	return out, nil
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
	// FinishedAt is when a SUCCEEDED or DEAD task finished; with the id it
	// identifies one death of a task (a redriven task can die again).
	FinishedAt *time.Time
}

const renewSQL = `
WITH l AS (` + lockRunning + `
)
UPDATE ingest_task t SET lease_until = now() + $3 * interval '1 millisecond', updated_at = now()
FROM l WHERE t.id = l.id AND l.status = 'RUNNING' AND l.lease_owner = $2
      AND ` + targetGuard + `
RETURNING t.id`

// Renew extends owner's lease on the RUNNING tasks of ids and returns the
// ids whose lease it renewed; the others were lost (taken over or finished).
// A renewal is no state change and writes no audit row.
func (s *Store) Renew(ctx context.Context, owner string, lease time.Duration, ids ...uuid.UUID) ([]uuid.UUID, error) {
	ids = distinct(ids)
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.db.Query(ctx, renewSQL, ids, owner, lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(ids), err)
	}
	renewed, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("renew %d leases: %w", len(ids), err)
	}
	return renewed, nil
}

// The completion statements below each change the rows of $1 that owner
// $2 holds RUNNING and write one audit row per change: one statement, one
// round trip, one implicit transaction. The rows are locked in id order
// and found through the primary key alone.

// guardedTail returns the rows cte u changed. The current state of the
// others is read afterwards, by a statement of its own (see
// guardedStatement): the rows this one found locked are read in the
// version that the lock holder committed.
const guardedTail = `
SELECT id, status, attempt_count, next_retry_at, last_error, finished_at FROM u`

// currentSQL reads the current state of tasks a guard refused.
const currentSQL = `
SELECT t.id, t.status, t.attempt_count, t.next_retry_at, coalesce(t.last_error, ''), coalesce(t.lease_owner, ''), t.finished_at
FROM unnest($1::uuid[]) AS x(id) JOIN ingest_task t ON t.id = x.id`

// lockRunning locks the rows of $1 in id order, found through the primary
// key alone, and reads their latest committed version; the UPDATE that
// follows guards on these columns (status, lease_owner), not on
// indexable ones of its own target, so that no plan scans an index of
// status (whose statistics a queue makes stale) instead of the key. A
// locked row cannot change until the statement commits.
const lockRunning = `
    SELECT t.id, t.status, t.lease_owner FROM unnest($1::uuid[]) AS x(id) JOIN ingest_task t ON t.id = x.id
    ORDER BY t.id FOR NO KEY UPDATE OF t`

// targetGuard repeats l's guard on the UPDATE's target row t, so that
// Postgres re-checks it on the row's latest version. It is a CASE, not a
// plain qual: the planner cannot match a CASE to an index, so no plan
// reads the target rows from a status index, with stale statistics
// (autovacuum off or behind) a scan of every RUNNING task per statement:
// 10 s for 170 ids among 200,000 RUNNING tasks. The rows come through the
// primary key, joined to l.
const targetGuard = `CASE WHEN t.status = 'RUNNING' AND t.lease_owner = $2 THEN true ELSE false END`

// guardedReturning is the RETURNING list of u.
const guardedReturning = `RETURNING t.id, t.status, t.attempt_count, t.next_retry_at, coalesce(t.last_error, '') AS last_error, t.finished_at`

const succeedSQL = `
WITH l AS (` + lockRunning + `
), u AS (
    UPDATE ingest_task t SET status = 'SUCCEEDED', lease_owner = NULL, lease_until = NULL, next_retry_at = NULL,
        finished_at = now(), updated_at = now()
    FROM l WHERE t.id = l.id AND l.status = 'RUNNING' AND l.lease_owner = $2
      AND ` + targetGuard + `
    ` + guardedReturning + `
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, worker)
    SELECT id, 'RUNNING', 'SUCCEEDED', attempt_count, $2 FROM u
)` + guardedTail

// Succeed moves the tasks of ids that owner holds RUNNING to SUCCEEDED.
func (s *Store) Succeed(ctx context.Context, owner string, ids ...uuid.UUID) ([]Result, error) {
	ids = distinct(ids)
	return s.guardedStatement(ctx, "succeed", ids, succeedSQL, ids, owner)
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
// min($3 * 2^(attempt-1), $4) * (1 ± $5), in (fractional) ms.
const failSQL = `
WITH f AS (
    SELECT * FROM unnest($1::uuid[], $6::text[], $7::bool[], $8::bigint[], $9::text[]) AS f(id, err, permanent, retry_after_us, msg)
), l AS (` + lockRunning + `
), u AS (
    UPDATE ingest_task t SET
        attempt_count = t.attempt_count + 1,
        status        = CASE WHEN f.permanent OR t.attempt_count + 1 >= t.max_attempts THEN 'DEAD' ELSE 'RETRYING' END,
        next_retry_at = CASE WHEN f.permanent OR t.attempt_count + 1 >= t.max_attempts THEN NULL
                             WHEN f.retry_after_us > 0 THEN now() + f.retry_after_us * interval '1 microsecond'
                             ELSE now() + least($3::float8 * power(2::float8, least(t.attempt_count, 62)), $4::float8)
                                          * (1 + $5::float8 * (2 * random() - 1)) * interval '1 millisecond' END,
        finished_at   = CASE WHEN f.permanent OR t.attempt_count + 1 >= t.max_attempts THEN now() END,
        last_error    = f.err,
        error_message = f.err,
        lease_owner   = NULL,
        lease_until   = NULL,
        updated_at    = now()
    FROM f, l
    WHERE t.id = f.id AND t.id = l.id AND l.status = 'RUNNING' AND l.lease_owner = $2
      AND ` + targetGuard + `
    ` + guardedReturning + `
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT u.id, 'RUNNING', u.status, u.attempt_count, NULLIF(f.msg, ''), $2 FROM u JOIN f ON f.id = u.id
)` + guardedTail

// Fail records failed runs of tasks that owner holds RUNNING: each goes
// RETRYING (due after the backoff, or RetryAfter) while attempts remain, and
// DEAD when they are exhausted or the failure is permanent.
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
	b := s.cfg.Backoff
	return s.guardedStatement(ctx, "fail", ids, failSQL, ids, owner, ms(b.Base), ms(b.Max), b.Jitter, errs, perm, after, msgs)
}

// ms is d in fractional milliseconds: a policy such as 1.5 ms keeps its
// sub-millisecond part (Duration.Milliseconds would truncate it).
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

const releaseSQL = `
WITH l AS (` + lockRunning + `
), u AS (
    UPDATE ingest_task t SET status = 'RETRYING', next_retry_at = now(), lease_owner = NULL, lease_until = NULL, updated_at = now()
    FROM l WHERE t.id = l.id AND l.status = 'RUNNING' AND l.lease_owner = $2
      AND ` + targetGuard + `
    ` + guardedReturning + `
), audit AS (
    INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
    SELECT id, 'RUNNING', 'RETRYING', attempt_count, 'released at shutdown', $2 FROM u
)` + guardedTail

// Release hands back tasks that owner holds RUNNING without counting a
// failure (graceful shutdown): they go RETRYING, due at once.
func (s *Store) Release(ctx context.Context, owner string, ids ...uuid.UUID) ([]Result, error) {
	ids = distinct(ids)
	return s.guardedStatement(ctx, "release", ids, releaseSQL, ids, owner)
}

const redriveSQL = `
UPDATE ingest_task t SET status = 'QUEUED', attempt_count = 0, next_retry_at = NULL, finished_at = NULL,
    lease_owner = NULL, lease_until = NULL, updated_at = now()
FROM (SELECT id FROM ingest_task WHERE id = ANY($1::uuid[])
      AND CASE WHEN status = 'DEAD' THEN true ELSE false END ORDER BY id FOR NO KEY UPDATE) l
WHERE t.id = l.id AND CASE WHEN t.status = 'DEAD' THEN true ELSE false END
RETURNING t.id, t.status, t.attempt_count, t.next_retry_at, coalesce(t.last_error, ''), '', t.finished_at`

// Redrive moves DEAD tasks back to QUEUED with their attempts reset (the
// audit trail keeps the history) and a new outbox event, in one
// transaction. actor is recorded as the transition's worker.
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
	res, err := s.guardedTx(ctx, tx, ids, func(tx pgx.Tx) (pgx.Rows, error) {
		return tx.Query(ctx, redriveSQL, ids)
	}, func(r Result) transition.Record {
		return transition.Record{TaskID: r.ID, From: string(Dead), To: string(Queued), AttemptCount: 0, Worker: actor, Message: "redrive"}
	})
	if err != nil {
		return nil, fmt.Errorf("redrive: %w", err)
	}
	var applied []uuid.UUID
	for _, r := range res {
		if r.Applied {
			applied = append(applied, r.ID)
		}
	}
	if err := outbox.Insert(ctx, tx, s.cfg.Stream, applied...); err != nil {
		return nil, err
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
	err := s.retry(ctx, func() error {
		clear(byID)
		rows, err := s.db.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r := Result{Applied: true}
			if err := rows.Scan(&r.ID, &r.Status, &r.AttemptCount, &r.NextRetryAt, &r.LastError, &r.FinishedAt); err != nil {
				return err
			}
			byID[r.ID] = r
		}
		// The statement's implicit transaction has committed once the
		// rows are read without error.
		return rows.Err()
	})
	var out []Result
	if err == nil {
		// Read with a fresh snapshot, after the statement committed.
		out, err = withRefused(ctx, s.db, ids, byID)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %d tasks: %w", op, len(ids), err)
	}
	return out, nil
}

// withRefused returns one Result per id, in order: the applied ones of
// byID, and for the ids a guard refused (rare: a lost lease, a race) their
// current state, read through q.
func withRefused(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, ids []uuid.UUID, byID map[uuid.UUID]Result) ([]Result, error) {
	if len(byID) < len(ids) {
		var refused []uuid.UUID
		for _, id := range ids {
			if _, ok := byID[id]; !ok {
				refused = append(refused, id)
			}
		}
		rows, err := q.Query(ctx, currentSQL, refused)
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
	applied, err := pgx.CollectRows(rows, scanResult)
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
