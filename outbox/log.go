package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The outbox log (migration 00039) holds the rows of tasks created due
// now, appended by InsertLog in the creating transaction. A relay's pass
// takes the log's next rows in commit order beside the outbox_row rows it
// claims (logTakeSQL, in the claim's round trip and transaction),
// publishes them in the same pipeline, and at its commit records one
// batch row for them, whose last row is the log's position from then on
// (logRecordSQL): no row of the log is written again, and nothing is
// updated. One pass at a time takes log rows (an advisory lock for its
// transaction); a pass that dies before its commit leaves the position
// where it was, so the next publishes the same rows again (at most that
// batch twice). A row whose publish failed is moved into
// outbox_row, RETRYING with the relay's backoff (logFailedSQL); one whose
// task is gone is deleted (logOrphanSQL). With its rounds emptied (a
// TRUNCATE of the log's tables) the next pass starts a round that takes
// every committed row of the log (migration 00040).

// logTakeSQL takes up to $1 rows of the log, in commit order, for the
// pass whose transaction it runs in (nothing when another pass holds the
// log's advisory lock).
const logTakeSQL = `SELECT id, task_id, stream, txid, kind, created_at, traceparent, priority, orphan FROM outbox_log_take($1)`

// logRecordSQL records, in the pass's transaction, the publish of the
// log's rows it took up to ($2, $3): rows $4 published as entries $5 to
// streams $6 by relay $1. It returns the batch's time.
const logRecordSQL = `SELECT outbox_log_record($1, $2, $3, $4::bigint[], $5::text[], $6::text[])`

// logOrphanSQL deletes the log's rows $1, whose tasks are gone.
const logOrphanSQL = `DELETE FROM outbox_log WHERE id = ANY($1::bigint[])`

// logFailedSQL moves the log's rows $1, whose publish failed (errors $2),
// into outbox_row with their ids, after one failed attempt: RETRYING due
// after the backoff (max attempts $3, base $4 and max $5 in ms, jitter
// $6), or DEAD when one attempt is all there is. The ordinary passes
// retry them from there.
var logFailedSQL = `
WITH f AS (
    SELECT s.id, s.err FROM unnest($1::bigint[], $2::text[]) AS s(id, err)
), m AS (
    DELETE FROM outbox_log l USING f WHERE l.id = f.id
    RETURNING l.id, l.task_id, l.stream, l.created_at, f.err
)
INSERT INTO outbox_row (id, task_id, stream, status, attempt_count, next_retry_at, last_error, created_at)
SELECT m.id, m.task_id, m.stream, ` + failedStatusSQL("1", "$3") + `, 1,
       ` + failedRetryFromSQL("statement_timestamp()", "1", "$3", "$4", "$5", "$6") + `, m.err, m.created_at
FROM m ORDER BY m.id
RETURNING status`

// insertLogSQL appends one row per task id ($1) to the log, for stream
// $2.
const insertLogSQL = `
INSERT INTO outbox_log (task_id, stream)
SELECT id, $2 FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, ord) ORDER BY ord`

// InsertLog writes the outbox rows of tasks due now to the log, to be
// published to stream: call it in the transaction that creates them. The
// tasks must have no group and no sequence (their rows go to outbox_row:
// Insert), and no row of theirs may be written later in the same
// transaction. Relays are notified when it commits, as for Insert.
func InsertLog(ctx context.Context, db Execer, stream string, taskIDs ...uuid.UUID) error {
	if len(taskIDs) == 0 {
		return nil
	}
	if _, err := db.Exec(ctx, insertLogSQL, taskIDs, stream); err != nil {
		return fmt.Errorf("insert %d outbox log rows: %w", len(taskIDs), err)
	}
	return nil
}

// logTaken is what a pass took of the log: its rows are in claimed.rows
// (logged), its orphans here; last is the last row it took, in commit
// order (txid, id), which its batch records.
type logTaken struct {
	orphans []int64
	lastTx  string
	lastID  int64
}

// took reports whether the pass took rows of the log.
func (l logTaken) took() bool { return l.lastTx != "" }

// scanLogTaken reads logTakeSQL's rows into c.
func scanLogTaken(rows pgx.Rows, c *claimed) error {
	var rw row
	var txid string
	var priority int16
	var orphan bool
	_, err := pgx.ForEachRow(rows, []any{&rw.id, &rw.taskID, &rw.stream, &txid, &rw.kind, &rw.createdAt, &rw.traceparent, &priority, &orphan}, func() error {
		c.log.lastTx, c.log.lastID = txid, rw.id
		if orphan {
			c.log.orphans = append(c.log.orphans, rw.id)
			return nil
		}
		rw.priority, rw.logged = int(priority), true
		c.rows = append(c.rows, rw)
		return nil
	})
	return err
}

// marked is the part of a pass's published rows that one table holds:
// the published rows (sent), their ids, entry ids and destinations, and
// the ids and errors of the failed ones.
type marked struct {
	sent             []row
	ids, failedIDs   []int64
	streamIDs, dests []string
	errs             []string
}

// byTable splits a pass's published rows (sent with sentIDs, failed with
// failMsgs) into those of outbox_row and those of the log.
func (r *Relay) byTable(sent []row, sentIDs []string, failed []row, failMsgs []string) (table, log marked) {
	for i, rw := range sent {
		m := &table
		if rw.logged {
			m = &log
		}
		m.sent, m.ids = append(m.sent, rw), append(m.ids, rw.id)
		m.streamIDs, m.dests = append(m.streamIDs, sentIDs[i]), append(m.dests, r.dest(rw))
	}
	for i, rw := range failed {
		m := &table
		if rw.logged {
			m = &log
		}
		m.failedIDs, m.errs = append(m.failedIDs, rw.id), append(m.errs, failMsgs[i])
	}
	return table, log
}

// queueLog queues, in the commit of pass c, what records its log rows
// (log): the failed ones moved (logFailedSQL), the orphans deleted, then
// the batch of the published ones (logRecordSQL); readLog reads their
// results.
func (r *Relay) queueLog(batch *pgx.Batch, c claimed, log marked) {
	if !c.log.took() {
		return
	}
	if len(log.failedIDs) > 0 {
		baseMS, maxMS, jitter := r.cfg.Backoff.SQLArgs()
		batch.Queue(logFailedSQL, log.failedIDs, log.errs, r.cfg.MaxAttempts, baseMS, maxMS, jitter)
	}
	if len(c.log.orphans) > 0 {
		batch.Queue(logOrphanSQL, c.log.orphans)
	}
	// Nil arrays (none published) are NULL, which the batch stores empty.
	batch.Queue(logRecordSQL, r.cfg.ID, c.log.lastTx, c.log.lastID, log.ids, log.streamIDs, log.dests)
}

// readLog reads the results queueLog queued: the failed rows' statuses,
// and the publish delays of the published ones (from their creation to
// the batch's time).
func readLog(br pgx.BatchResults, c claimed, log marked) (statuses []string, delays []float64, err error) {
	if !c.log.took() {
		return nil, nil, nil
	}
	if len(log.failedIDs) > 0 {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			statuses, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if len(c.log.orphans) > 0 {
		if _, err = br.Exec(); err != nil {
			return nil, nil, err
		}
	}
	var at pgtype.Timestamptz
	if err = br.QueryRow().Scan(&at); err != nil {
		return nil, nil, err
	}
	for _, rw := range log.sent {
		delays = append(delays, at.Time.Sub(rw.createdAt).Seconds())
	}
	return statuses, delays, nil
}

// pruneLogSQL retires the log's rows published more than $1 ms ago, and
// deletes what no remaining row needs (migration 00039).
const pruneLogSQL = `SELECT outbox_log_prune($1 * interval '1 millisecond')`

// PruneLog retires the outbox log's rows that were published and created
// more than keep ago (those of tasks that still exist move into
// outbox_row), deletes the batches and rounds no remaining row needs,
// and returns how many rows it retired. The leader runs it beside
// the drop of outbox_row's partitions (package maintenance).
func PruneLog(ctx context.Context, db RowQuerier, keep time.Duration) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, pruneLogSQL, keep.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune the outbox log: %w", err)
	}
	return n, nil
}
