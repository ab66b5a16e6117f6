// Package partition owns what the tables partitioned by time share: the
// audit table (ingest_task_transition, by created_at, package transition)
// and the outbox (outbox_event, by id ranges opened ahead by time,
// package outbox). Each of those packages lists and extends its own
// table's partitions; the steps that end a partition are here, the same
// for both: whether a transaction that may still write to it is open
// (OpenBefore), which task still needs it (Blocker), dropping it while
// keeping the rows of the tasks that still exist (Retire), and deleting
// from the DEFAULT partition the kept rows whose task is gone (Sweep).
//
// The rows of both tables belong to a task (column task_id) that may
// outlive the partition they were written in: a task that waits for
// weeks, or one kept forever. Retire moves such rows into the table's
// DEFAULT partition, so a task's history is whole for as long as the task
// exists, and the partition is dropped all the same.
package partition

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the partition functions need: a pool or a connection.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// lockTimeoutSQL bounds the lock waits of the next statement of the batch
// (in its implicit transaction): a DDL statement waiting for its lock
// would queue every writer of the table behind it.
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

// WithLockTimeout runs the statement (which returns one row, scanned into
// dest) after bounding its lock waits to wait, in one round trip and one
// implicit transaction. A lock not obtained within wait fails it, to be
// retried.
func WithLockTimeout(ctx context.Context, db DB, wait time.Duration, sql string, args []any, dest ...any) error {
	b := &pgx.Batch{}
	b.Queue(lockTimeoutSQL, fmt.Sprintf("%dms", max(wait.Milliseconds(), 1)))
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// openBeforeSQL tells whether a transaction of this database that began
// before $1 is still open (or prepared): its rows, dated by its now() or
// numbered by the ids it took, may still land in a partition that ended
// at $1. Autovacuum writes no row.
const openBeforeSQL = `
SELECT EXISTS (SELECT 1 FROM pg_stat_activity
               WHERE datname = current_database() AND xact_start < $1 AND pid <> pg_backend_pid()
                 AND backend_type <> 'autovacuum worker')
    OR EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE database = current_database() AND prepared < $1)`

// OpenBefore reports whether a transaction that began before t is still
// open: until none is, a partition that ended at t may still receive rows.
// Transactions of other roles count too when the role may see their
// start (pg_read_all_stats); those it may not see are not counted.
func OpenBefore(ctx context.Context, db DB, t time.Time) (bool, error) {
	var open bool
	if err := db.QueryRow(ctx, openBeforeSQL, t).Scan(&open); err != nil {
		return false, fmt.Errorf("look for transactions open since before %s: %w", t.Format(time.RFC3339), err)
	}
	return open, nil
}

// blockerSQL finds a task that still exists and has a row in the
// partition %s, if any. The partition's rows are read (on an index that
// leads with task_id, or whole) and each probes the task table's primary
// key, stopping at the first that finds its task.
const blockerSQL = `
SELECT a.task_id FROM %s a WHERE EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = a.task_id) LIMIT 1`

// Blocker returns a task that still exists and has a row in the
// partition, and false when there is none.
func Blocker(ctx context.Context, db DB, part string) (uuid.UUID, bool, error) {
	var id uuid.UUID
	err := db.QueryRow(ctx, fmt.Sprintf(blockerSQL, pgx.Identifier{part}.Sanitize())).Scan(&id)
	switch {
	case err == pgx.ErrNoRows:
		return uuid.UUID{}, false, nil
	case err != nil:
		return uuid.UUID{}, false, fmt.Errorf("look for a task with rows in %s: %w", part, err)
	}
	return id, true, nil
}

// TaskExists reports whether the task still exists (a partition's known
// blocker: while it exists, the partition is not read again).
func TaskExists(ctx context.Context, db DB, id uuid.UUID) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ingest_task WHERE id = $1)`, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("look up task %s: %w", id, err)
	}
	return ok, nil
}

// Retire drops the partition part of the table parent, keeping the rows
// of the tasks that still exist (ingest_partition_retire): they are read
// first without blocking writers, then, in one transaction under ACCESS
// EXCLUSIVE on the parent, those whose task has gone meanwhile are left
// out, the partition is detached, the rest are written into the DEFAULT
// partition (with their ids and times; no trigger of the parent fires)
// and the partition is dropped. It returns how many rows it kept, and
// dropped false, with nothing changed, when more than keepMax rows would
// have to be kept: the partition is still needed and stays.
//
// The caller has checked that no transaction can still write to the
// partition (OpenBefore), and for the outbox that every row in it is
// finished (SENT or DEAD). The exclusive lock is waited for at most
// wait, and so writers of the table wait at most that long behind it; a
// timeout fails Retire, to be retried.
func Retire(ctx context.Context, db DB, parent, part string, keepMax int, wait time.Duration) (kept int, dropped bool, err error) {
	var n int64
	err = WithLockTimeout(ctx, db, wait, `SELECT ingest_partition_retire($1::regclass, $2::regclass, $3)`,
		[]any{pgx.Identifier{parent}.Sanitize(), pgx.Identifier{part}.Sanitize(), keepMax}, &n)
	if err != nil {
		return 0, false, fmt.Errorf("drop the partition %s of %s: %w", part, parent, err)
	}
	if n < 0 {
		return 0, false, nil
	}
	return int(n), true, nil
}

// sweepSQL deletes the rows of the DEFAULT partition %s whose task is
// gone: rows Retire kept for a task that retention, or an operator, has
// deleted since.
const sweepSQL = `DELETE FROM %s a WHERE NOT EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = a.task_id)`

// Sweep deletes the rows of the DEFAULT partition dflt whose task no
// longer exists and returns how many. The DEFAULT partition holds the
// rows Retire kept (few: at most its keepMax a dropped partition) and
// those written beyond the partitions created ahead (on a new database,
// its first minute or two of outbox rows); it is read whole.
func Sweep(ctx context.Context, db DB, dflt string) (int, error) {
	tag, err := db.Exec(ctx, fmt.Sprintf(sweepSQL, pgx.Identifier{dflt}.Sanitize()))
	if err != nil {
		return 0, fmt.Errorf("delete the rows of deleted tasks from %s: %w", dflt, err)
	}
	return int(tag.RowsAffected()), nil
}
