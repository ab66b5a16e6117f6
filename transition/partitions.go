package transition

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/partition"
)

// The audit table is partitioned by RANGE (created_at) (migration 00024):
// retention drops whole partitions instead of deleting rows. The functions
// below are the audit table's part of the leader's steps (package
// maintenance): list the partitions (Partitions) and keep them ahead of
// time (Extend); ending a past one is package partition's (Retire).

// DB is what the partition functions need: a pool or a connection.
type DB = partition.DB

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

// Extend creates the partitions, each width wide, from the end of the
// newest one until they reach now() + ahead, and returns how many it
// created (ingest_task_transition_extend). A lock not obtained within
// wait fails it, to be retried. Each partition is attached under SHARE
// UPDATE EXCLUSIVE, which the writers of audit rows do not wait for.
func Extend(ctx context.Context, db DB, width, ahead, wait time.Duration) (int, error) {
	var n int
	err := partition.WithLockTimeout(ctx, db, wait,
		`SELECT ingest_task_transition_extend($1::bigint * interval '1 millisecond', $2::bigint * interval '1 millisecond')`,
		[]any{width.Milliseconds(), ahead.Milliseconds()}, &n)
	if err != nil {
		return 0, fmt.Errorf("create the audit partitions ahead: %w", err)
	}
	return n, nil
}
