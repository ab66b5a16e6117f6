package outbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// A relay's pass holds the rows it publishes by their row locks, in one
// transaction open from the claim to the marking, and writes each row
// once: SENT with its entry id (or RETRYING or DEAD). A claim that stamped
// claimed_by/claimed_until cost every row an update of its own (a new
// version of the row, a WAL record, and a dead version for vacuum) before
// the update that marks it; a row lock costs a small WAL record and
// leaves no version behind. The rows it takes of the outbox log are held
// by the log's advisory lock, and written not at all: one batch row
// records them (log.go).
//
// The transaction replaces the lease:
//
//   - a relay that dies mid-pass (its connection closes) aborts its
//     transaction: the rows are free at once, NEW or RETRYING as they
//     were, and the next pass publishes them again, at most that batch;
//   - a relay that stalls past its Lease (a frozen process) is taken over:
//     a pass whose session has been idle in its transaction for longer
//     than the Lease is terminated by the next claim of any relay of the
//     same database role (takeOverSQL), which then claims the rows; the
//     stalled relay's marking then fails on its closed connection and
//     changes nothing (DrainResult.Stale). A pass that stalls with no
//     other relay running keeps its rows and marks them when it resumes,
//     unless it stays idle for abandonAfter leases, when Postgres ends
//     its session (idle_in_transaction_session_timeout), so that a frozen
//     process holds no row lock and no transaction id for longer;
//   - while it holds them, the pass's session names its relay:
//     application_name is passAppPrefix + the relay's ID (cut to the 63
//     bytes Postgres keeps), and the rows' xmax (read in outbox_row: the
//     view outbox_event has no system columns) is the session's
//     backend_xid (pg_stat_activity).
//
// Rows inserted claimed for direct publishing (insertClaimed) keep their
// claim: a pass skips them until it expires.

// passAppPrefix begins the application_name of a pass's session while it
// holds rows; takeOverSQL finds stalled passes by it.
const passAppPrefix = "ingest-outbox-pass "

// abandonAfter is how many leases a pass may stay idle in its transaction
// before Postgres ends its session, whether or not another relay took its
// rows over.
const abandonAfter = 10

// takeOverSQL terminates the sessions of passes of the same role and
// database that have
// been idle in their transaction for longer than $1 ms (the lease),
// waiting up to $2 ms for each to end, so that their row locks are free
// for the claim sent after it. It returns how many it ended.
const takeOverSQL = `
SELECT count(*) FILTER (WHERE pg_terminate_backend(a.pid, $2::bigint)) FROM pg_stat_activity a
WHERE starts_with(a.application_name, '` + passAppPrefix + `') AND a.state = 'idle in transaction'
  AND a.state_change < now() - $1 * interval '1 millisecond'
  AND a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.usename = current_user`

// passSettingsSQL opens a pass's transaction: claimPlanSQL's planner
// settings, the session's application_name ($1) and its idle timeout ($2,
// in ms), all for the transaction only.
const passSettingsSQL = `
SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
       set_config('application_name', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)`

// claimSQL locks up to $1 due rows, oldest due first, among those due at
// or after $2 (the relay's bound on the claim index, scan.go; -infinity:
// all), and reads what their messages need. A row is due when unsent,
// next_retry_at has come, and it is not under a live claim of direct
// publishing. SKIP LOCKED lets concurrent passes take disjoint batches; a
// row another pass marked meanwhile is re-checked against the WHERE clause
// after locking, so it is skipped. A row whose task is gone comes back
// with orphan true; one whose task has a group and a due time of its own
// (a delayed task fallen due, which its group's window may hold back:
// holdSQL) with holdable true. Each row comes with its next_retry_at, the
// first one's being the relay's next bound.
const claimSQL = `
WITH due AS (
    SELECT id, task_id, stream, next_retry_at, created_at FROM outbox_row
    WHERE status IN ('NEW', 'RETRYING') AND next_retry_at >= $2 AND next_retry_at <= now()
      AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY next_retry_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
SELECT d.id, d.task_id, d.stream, coalesce(t.kind, ''), d.created_at, coalesce(t.traceparent, ''),
       coalesce(t.priority, 2), t.id IS NULL, d.next_retry_at, t.group_key IS NOT NULL AND t.next_retry_at IS NOT NULL
FROM due d LEFT JOIN ingest_task t ON t.id = d.task_id
ORDER BY d.next_retry_at, d.id`

// holdSQL holds those of the tasks $1 (a pass's holdable rows) that their
// group's window holds back when they fall due: it parks them, in the
// pass's transaction, and returns them (migration 00032). The pass deletes
// their rows (withdrawSQL) instead of publishing them; the release that
// unparks a task writes it a new row.
const holdSQL = `SELECT ingest_task_hold_due($1::uuid[])`

// withdrawSQL deletes the rows $1 of a pass whose tasks holdSQL parked.
const withdrawSQL = `DELETE FROM outbox_row WHERE id = ANY($1::bigint[]) AND status IN ('NEW', 'RETRYING')`

// The marking statements of a pass take their times from
// statement_timestamp(): now() is the start of the pass's transaction,
// before the publish.

// lockedGuard holds for a row still unsent. The pass holds the row's lock,
// so nothing else has changed it; the guard keeps the marking idempotent.
// It is a CASE, for the reason claimedGuard is.
const lockedGuard = `CASE WHEN o.status IN ('NEW', 'RETRYING') THEN true ELSE false END`

// markSentLockedSQL is markSentSQL for the rows of a pass ($2, entry ids
// $3, destinations $4): claimed_by names the relay that published them
// ($1), claimed_until is cleared.
var markSentLockedSQL = `
WITH c AS (
    SELECT s.id, s.val, s.dest FROM unnest($2::bigint[], $3::text[], $4::text[]) AS s(id, val, dest) ORDER BY s.id
)
UPDATE outbox_row o SET status = 'SENT', sent_at = statement_timestamp(), stream_id = c.val, stream = c.dest,
    claimed_by = $1, claimed_until = NULL
FROM c
WHERE o.id = c.id AND ` + lockedGuard + `
RETURNING extract(epoch FROM o.sent_at - (` + dueSinceSQL("o") + `))::float8`

// markFailedLockedSQL is markFailedSQL for the rows of a pass ($1, errors
// $2; max attempts $3, backoff base $4 and max $5 in ms, jitter $6).
var markFailedLockedSQL = `
WITH c AS (
    SELECT s.id, s.val FROM unnest($1::bigint[], $2::text[]) AS s(id, val) ORDER BY s.id
)
UPDATE outbox_row o SET
    attempt_count = o.attempt_count + 1,
    status        = ` + failedStatusSQL("o.attempt_count + 1", "$3") + `,
    next_retry_at = ` + failedRetryFromSQL("statement_timestamp()", "o.attempt_count + 1", "$3", "$4", "$5", "$6") + `,
    last_error    = c.val,
    claimed_by    = NULL,
    claimed_until = NULL
FROM c
WHERE o.id = c.id AND ` + lockedGuard + `
RETURNING o.status`

// orphanSQL leaves the rows $3 of a pass whose task is gone claimed by
// relay $1 for $2 ms, as a claim did before: a pass does not lock them
// again before then, so they never fill its batches.
const orphanSQL = `
UPDATE outbox_row SET claimed_by = $1, claimed_until = statement_timestamp() + $2 * interval '1 millisecond'
WHERE id = ANY($3::bigint[]) AND status IN ('NEW', 'RETRYING')`

// appName is the application_name of r's passes while they hold rows.
func (r *Relay) appName() string {
	name := passAppPrefix + r.cfg.ID
	for len(name) > 63 { // Postgres keeps NAMEDATALEN-1 bytes
		name = name[:len(name)-1]
	}
	return name
}

// claim takes over stalled passes, opens a pass's transaction and locks
// up to BatchSize due rows in it, in one round trip, reading the claim
// index from the relay's bound (scan.go). With rows, the returned claimed
// holds the connection and its open transaction (conn); finish ends it.
// Without, the transaction is ended here and conn is nil.
func (r *Relay) claim(ctx context.Context) (claimed, error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return claimed{}, fmt.Errorf("claim outbox rows: %w", err)
	}
	lease := r.cfg.Lease.Milliseconds()
	batch := &pgx.Batch{}
	batch.Queue(takeOverSQL, lease, r.cfg.PublishTimeout.Milliseconds())
	batch.Queue("BEGIN")
	batch.Queue(passSettingsSQL, r.appName(), strconv.FormatInt(abandonAfter*lease, 10))
	// The marking statements write what the claim reads (LockForWrite).
	batch.Queue(writeLockSQL)
	bound, token := r.from.claim()
	batch.Queue(claimSQL, r.cfg.BatchSize, bound)
	batch.Queue(logTakeSQL, r.cfg.BatchSize)
	var c claimed
	var holdables []uuid.UUID
	var taken int64
	var first pgtype.Timestamptz
	br := conn.SendBatch(ctx, batch)
	err = br.QueryRow().Scan(&taken)
	for range 3 { // BEGIN, the settings, the lock
		if err == nil {
			_, err = br.Exec()
		}
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			var rw row
			var orphan, holdable bool
			var due pgtype.Timestamptz
			_, err = pgx.ForEachRow(rows, []any{&rw.id, &rw.taskID, &rw.stream, &rw.kind, &rw.createdAt, &rw.traceparent, &rw.priority, &orphan, &due, &holdable}, func() error {
				if !first.Valid {
					first = due
				}
				switch {
				case orphan:
					c.orphans = append(c.orphans, rw.id)
				case holdable:
					holdables = append(holdables, rw.taskID)
					fallthrough
				default:
					c.rows = append(c.rows, rw)
				}
				return nil
			})
		}
	}
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			err = scanLogTaken(rows, &c)
		}
	}
	err = errors.Join(err, br.Close())
	if err == nil && len(holdables) > 0 {
		err = c.hold(ctx, conn, holdables)
	}
	if err != nil {
		endPass(conn)
		r.from.reset()
		return claimed{}, fmt.Errorf("claim outbox rows: %w", err)
	}
	switch {
	case taken > 0:
		// The stalled passes' rows are free again, wherever they sort.
		r.from.reset()
		r.logger.Warn("outbox relay took over passes stalled past their lease: their rows are published again", "passes", taken)
	case first.Valid:
		r.from.found(first, token)
	}
	if len(c.rows) == 0 && len(c.orphans) == 0 && len(c.withdrawn) == 0 && !c.log.took() {
		endPass(conn)
		return claimed{}, nil
	}
	c.conn = conn
	return c, nil
}

// hold runs holdSQL in the pass's transaction (on conn) for the tasks of its
// holdable rows, and moves the rows of the tasks it parked from c.rows to
// c.withdrawn.
func (c *claimed) hold(ctx context.Context, conn *pgxpool.Conn, tasks []uuid.UUID) error {
	var held []uuid.UUID
	if err := conn.QueryRow(ctx, holdSQL, tasks).Scan(&held); err != nil {
		return fmt.Errorf("hold delayed tasks to their groups' windows: %w", err)
	}
	if len(held) == 0 {
		return nil
	}
	parked := make(map[uuid.UUID]bool, len(held))
	for _, id := range held {
		parked[id] = true
	}
	kept := c.rows[:0]
	for _, rw := range c.rows {
		if parked[rw.taskID] {
			c.withdrawn = append(c.withdrawn, rw.id)
		} else {
			kept = append(kept, rw)
		}
	}
	c.rows = kept
	return nil
}

// endPass rolls back the transaction of conn, if one is open, and returns
// conn to the pool (which closes a connection it could not roll back).
func endPass(conn *pgxpool.Conn) {
	if conn.Conn().PgConn().TxStatus() != 'I' && !conn.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = conn.Exec(ctx, "ROLLBACK")
		cancel()
	}
	conn.Release()
}

// commitPass marks the rows of pass c after their publish (ids[i] or
// errs[i]) and commits its transaction, in one round trip: SENT with their
// entry ids, or RETRYING or DEAD; its orphans are left claimed. If the
// transaction cannot commit because the session has ended (a relay took
// the pass over), nothing changed: the rows count as Stale and the error
// is nil.
func (r *Relay) commitPass(ctx context.Context, c claimed, ids []string, errs []error) (DrainResult, error) {
	defer endPass(c.conn)
	res := DrainResult{Claimed: len(c.rows) + len(c.orphans) + len(c.withdrawn) + len(c.log.orphans), Held: len(c.withdrawn)}
	if r.afterPublish != nil {
		r.afterPublish()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	sent, sentIDs, failed, failMsgs := splitPublished(c.rows, ids, errs)
	batch := &pgx.Batch{}
	batch.Queue(pgplan.Settings)
	table, log := r.byTable(sent, sentIDs, failed, failMsgs)
	if len(table.ids) > 0 {
		batch.Queue(markSentLockedSQL, r.cfg.ID, table.ids, table.streamIDs, table.dests)
	}
	if len(table.failedIDs) > 0 {
		baseMS, maxMS, jitter := r.cfg.Backoff.SQLArgs()
		batch.Queue(markFailedLockedSQL, table.failedIDs, table.errs, r.cfg.MaxAttempts, baseMS, maxMS, jitter)
	}
	if len(c.orphans) > 0 {
		batch.Queue(orphanSQL, r.cfg.ID, r.cfg.Lease.Milliseconds(), c.orphans)
	}
	if len(c.withdrawn) > 0 {
		batch.Queue(withdrawSQL, c.withdrawn)
	}
	r.queueLog(batch, c, log)
	batch.Queue("COMMIT")

	var delays []float64
	var statuses []string
	br := c.conn.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil && len(table.ids) > 0 {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			delays, err = pgx.CollectRows(rows, pgx.RowTo[float64])
		}
	}
	if err == nil && len(table.failedIDs) > 0 {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			statuses, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
	}
	if err == nil && len(c.orphans) > 0 {
		_, err = br.Exec()
	}
	if err == nil && len(c.withdrawn) > 0 {
		_, err = br.Exec()
	}
	if err == nil {
		var logStatuses []string
		var logDelays []float64
		if logStatuses, logDelays, err = readLog(br, c, log); err == nil {
			statuses, delays = append(statuses, logStatuses...), append(delays, logDelays...)
			_, err = br.Exec() // COMMIT
		}
	}
	if err = errors.Join(err, br.Close()); err != nil {
		if sessionEnded(c.conn, err) {
			res.Stale = len(c.rows)
			r.logPass(res, failMsgs)
			return res, nil
		}
		return res, fmt.Errorf("mark %d outbox rows: %w", len(c.rows), err)
	}
	for _, d := range delays {
		r.metrics.publishDelay.Observe(d)
	}
	r.metrics.publishTotal.WithLabelValues(resultSuccess).Add(float64(len(delays)))
	res.Published = len(delays)
	res.Retried, res.Dead = r.countFailed(statuses)
	res.Stale = len(sent) - len(delays) + len(failed) - len(statuses)
	r.logPass(res, failMsgs)
	return res, nil
}

// sessionEnded reports whether err, from a pass's transaction on conn,
// says that its session was ended by the server: terminated by a relay
// that took the pass over (57P01), or by its idle timeout (25P03).
func sessionEnded(conn *pgxpool.Conn, err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "57P01" || pgErr.Code == "25P03"
	}
	return conn.Conn().IsClosed()
}
