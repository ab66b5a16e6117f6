package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/partition"
)

// outbox_event is partitioned by RANGE (id) (migration 00027), each
// partition the ids that about a day takes: every statement that names a
// row by id reads one partition, and retention drops whole partitions
// instead of deleting SENT rows. The functions below are the outbox's
// part of the leader's steps (package maintenance): list the partitions
// with the last id taken (Partitions), open them ahead (Extend) and tell
// whether a partition still holds a row to publish (Unfinished); ending
// one is package partition's (Retire).

// Partition is one partition of outbox_event, holding the rows whose id
// is in [From, To).
type Partition struct {
	Name string
	// From and To bound the partition's ids; Unbounded is set for the
	// partition of the rows written before the table was partitioned (no
	// lower bound) and for the DEFAULT one.
	From, To  int64
	Unbounded bool
	// Default: the DEFAULT partition, which holds the rows no other
	// partition covers (those written beyond the partitions opened
	// ahead: on a new database, its first minute or two) and the rows of
	// tasks that outlived their partition (partition.Retire).
	Default bool
}

// partitionsSQL lists the partitions, lowest ids first, the DEFAULT one
// last, with the last id taken and the database's now().
const partitionsSQL = `
SELECT name, coalesce(lo, 0), coalesce(hi, 0), lo IS NULL, is_default, outbox_event_last_id(), now()
FROM outbox_event_partitions()`

// Partitions returns the partitions of outbox_event, lowest ids first and
// the DEFAULT partition last, the last id the sequence handed out (every
// row with an id up to it is written or being written) and the
// database's time when it was read.
func Partitions(ctx context.Context, db partition.DB) ([]Partition, int64, time.Time, error) {
	rows, err := db.Query(ctx, partitionsSQL)
	if err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("list the outbox partitions: %w", err)
	}
	var last int64
	var now time.Time
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Partition, error) {
		var p Partition
		err := r.Scan(&p.Name, &p.From, &p.To, &p.Unbounded, &p.Default, &last, &now)
		p.Unbounded = p.Unbounded || p.Default
		return p, err
	})
	if err != nil {
		return nil, 0, time.Time{}, fmt.Errorf("list the outbox partitions: %w", err)
	}
	return out, last, now, nil
}

// Extend opens the partitions from the end of the newest one until they
// reach the ids that ahead of time takes at the rate ids were taken over
// the last width (and at least minIDs past the last id taken), each
// holding the ids width of time takes (at least minIDs), and returns how
// many it created (outbox_event_extend). A lock not obtained within wait
// fails it, to be retried. Each partition is attached under SHARE UPDATE
// EXCLUSIVE, which the writers of outbox rows do not wait for; an insert
// that routed its rows before the attach would fail on a row the new
// partition covers. So when the first new partition would begin within a
// minute's ids (at least minIDs) of the last id taken, the extension
// first takes SHARE on the table, waiting (at most wait) for the writers
// of outbox rows and holding new ones until it commits, and begins just
// past the last id; ids the newest partition did not reach stay in the
// DEFAULT partition. The extension decides again before each partition's
// attach, with the last id read then, and takes the lock at that point if
// ids have come near meanwhile (moving the rows they sent to the DEFAULT
// partition in the new one's range into it).
func Extend(ctx context.Context, db partition.DB, width, ahead time.Duration, minIDs int64, wait time.Duration) (int, error) {
	var n int
	err := partition.WithLockTimeout(ctx, db, wait,
		`SELECT outbox_event_extend($1::bigint * interval '1 millisecond', $2::bigint * interval '1 millisecond', $3)`,
		[]any{width.Milliseconds(), ahead.Milliseconds(), minIDs}, &n)
	if err != nil {
		return 0, fmt.Errorf("create the outbox partitions ahead: %w", err)
	}
	return n, nil
}

// unfinishedSQL finds a row of the partition %s still to publish (NEW or
// RETRYING), on the partition's claim index.
const unfinishedSQL = `SELECT true FROM %s WHERE status IN ('NEW', 'RETRYING') LIMIT 1`

// Unfinished reports whether the partition holds a row still to publish:
// such a partition stays, whatever its tasks.
func Unfinished(ctx context.Context, db partition.DB, p Partition) (bool, error) {
	var found bool
	err := db.QueryRow(ctx, fmt.Sprintf(unfinishedSQL, pgx.Identifier{p.Name}.Sanitize())).Scan(&found)
	switch {
	case err == pgx.ErrNoRows:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("look for rows to publish in %s: %w", p.Name, err)
	}
	return true, nil
}
