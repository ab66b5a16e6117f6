package transition

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The audit table is partitioned by RANGE (created_at) (migration 00024):
// retention drops whole partitions instead of deleting rows. The functions
// below are the leader's steps (package maintenance): keep partitions
// ahead of time (Extend) and drop a past partition once no task that
// still exists has a row in it (Droppable, then DropPartition).

// DB is what the partition functions need: a pool or a connection.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Partition is one partition of ingest_task_transition, holding the rows
// created in [From, To).
type Partition struct {
	Name string
	// From and To bound the partition's rows; a zero From is no lower
	// bound (the partition of the rows written before the table was
	// partitioned), a zero To no upper bound.
	From, To time.Time
	// Default: the DEFAULT partition, which holds the rows no other
	// partition covers (none while the partitions are created ahead).
	Default bool
}

// partitionsSQL lists the partitions, oldest first, the DEFAULT one last,
// with the database's now().
const partitionsSQL = `
SELECT name, CASE WHEN lo = '-infinity' THEN NULL ELSE lo END, CASE WHEN hi = 'infinity' THEN NULL ELSE hi END,
       is_default, now()
FROM ingest_task_transition_partitions()
ORDER BY is_default, hi, lo`

// Partitions returns the partitions of the audit table, oldest first and
// the DEFAULT partition last, and the database's time.
func Partitions(ctx context.Context, db DB) ([]Partition, time.Time, error) {
	rows, err := db.Query(ctx, partitionsSQL)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("list the audit partitions: %w", err)
	}
	var now time.Time
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Partition, error) {
		var p Partition
		var from, to *time.Time
		err := r.Scan(&p.Name, &from, &to, &p.Default, &now)
		if from != nil {
			p.From = *from
		}
		if to != nil {
			p.To = *to
		}
		return p, err
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("list the audit partitions: %w", err)
	}
	return out, now, nil
}

// lockTimeoutSQL bounds the lock waits of the next statement of the batch
// (in its implicit transaction): a DDL statement waiting for its lock
// would queue every writer of audit rows behind it.
const lockTimeoutSQL = `SELECT set_config('lock_timeout', $1, true)`

func lockTimeout(d time.Duration) string { return fmt.Sprintf("%dms", max(d.Milliseconds(), 1)) }

// Extend creates the partitions, each width wide, from the end of the
// newest one until they reach now() + ahead, and returns how many it
// created (ingest_task_transition_extend). A lock not obtained within
// wait fails it, to be retried. Each partition is attached under SHARE
// UPDATE EXCLUSIVE, which the writers of audit rows do not wait for.
func Extend(ctx context.Context, db DB, width, ahead, wait time.Duration) (int, error) {
	b := &pgx.Batch{}
	b.Queue(lockTimeoutSQL, lockTimeout(wait))
	b.Queue(`SELECT ingest_task_transition_extend($1::bigint * interval '1 millisecond', $2::bigint * interval '1 millisecond')`,
		width.Milliseconds(), ahead.Milliseconds())
	br := db.SendBatch(ctx, b)
	_, err := br.Exec()
	var n int
	if err == nil {
		err = br.QueryRow().Scan(&n)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("create the audit partitions ahead: %w", err)
	}
	return n, nil
}

// openBeforeSQL tells whether a transaction of this database that began
// before $1 is still open (or prepared): its audit rows, dated by its
// now(), may still land in a partition that ends at $1. Autovacuum writes
// no audit row.
const openBeforeSQL = `
SELECT EXISTS (SELECT 1 FROM pg_stat_activity
               WHERE datname = current_database() AND xact_start < $1 AND pid <> pg_backend_pid()
                 AND backend_type <> 'autovacuum worker')
    OR EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE database = current_database() AND prepared < $1)`

// OpenBefore reports whether a transaction that began before t is still
// open: until none is, a partition that ends at t may still receive rows.
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
// partition %s, if any: the one query that decides whether the partition
// may be dropped. The partition's rows are read (on its primary key, or
// whole) and each probes the task table's primary key, stopping at the
// first that finds its task.
const blockerSQL = `
SELECT a.task_id FROM %s a WHERE EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = a.task_id) LIMIT 1`

// Blocker returns a task that still exists and has a row in the
// partition, and false when there is none: then every row of the
// partition belongs to a task that is gone, and the partition may be
// dropped once no transaction can still write to it (OpenBefore).
func Blocker(ctx context.Context, db DB, p Partition) (uuid.UUID, bool, error) {
	var id uuid.UUID
	err := db.QueryRow(ctx, fmt.Sprintf(blockerSQL, pgx.Identifier{p.Name}.Sanitize())).Scan(&id)
	switch {
	case err == pgx.ErrNoRows:
		return uuid.UUID{}, false, nil
	case err != nil:
		return uuid.UUID{}, false, fmt.Errorf("look for a task with rows in %s: %w", p.Name, err)
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

// DropPartition drops the partition, with its rows. The caller has
// checked that no task that exists has a row in it (Blocker) and that no
// transaction can still write to it (OpenBefore); DROP takes ACCESS
// EXCLUSIVE on the audit table for an instant, so a lock not obtained
// within wait fails it (the writers of audit rows wait at most that
// long), to be retried. The DEFAULT partition is never dropped.
func DropPartition(ctx context.Context, db DB, p Partition, wait time.Duration) error {
	if p.Default {
		return fmt.Errorf("drop %s: the DEFAULT audit partition is never dropped", p.Name)
	}
	b := &pgx.Batch{}
	b.Queue(lockTimeoutSQL, lockTimeout(wait))
	b.Queue(`DROP TABLE ` + pgx.Identifier{p.Name}.Sanitize())
	br := db.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("drop the audit partition %s: %w", p.Name, err)
	}
	return nil
}
