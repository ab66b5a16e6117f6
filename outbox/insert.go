package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is what Insert needs: a pool, a connection or a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// insertSQL writes one row per task id ($1) to stream $2, due at the
// matching time of $3 (a NULL, or a missing one when $3 is shorter, means
// now()). unnest pads the shorter array with NULLs.
const insertSQL = `
INSERT INTO outbox_row (task_id, stream, next_retry_at)
SELECT id, $2, coalesce(due, now())
FROM unnest($1::uuid[], $3::timestamptz[]) WITH ORDINALITY AS t(id, due, ord)
ORDER BY ord`

// writeLockSQL takes the lock that writing outbox_event takes on its table
// (outbox_row, migration 00038), ahead of reading it in the same
// transaction. It names the table: LOCK TABLE on the view would lock
// every partition of the table too.
const writeLockSQL = `LOCK TABLE ONLY outbox_row IN ROW EXCLUSIVE MODE`

// LockForWrite takes, in the transaction of db, the lock that writing
// outbox_event takes: call it first in a transaction that reads the table
// before it writes it. A read locks every partition, the DEFAULT one
// included, against an attach; an extension of the partitions
// (outbox_event_extend: SHARE on the table, then the DEFAULT partition
// for its attach) granted between the read and the write would wait for
// that lock while the write waited for its SHARE, a deadlock that
// PostgreSQL breaks only after its deadlock_timeout by failing one of
// them. Taken first, it makes the extension wait for the transaction, or
// the transaction for the extension.
func LockForWrite(ctx context.Context, db Execer) error {
	if _, err := db.Exec(ctx, writeLockSQL); err != nil {
		return fmt.Errorf("lock outbox_event for writing: %w", err)
	}
	return nil
}

// Insert writes one NEW outbox_event per task, to be published to stream
// now. Call it in the transaction that creates (or redrives) the tasks: the
// rows become visible, and the relays are notified, only when it commits.
func Insert(ctx context.Context, db Execer, stream string, taskIDs ...uuid.UUID) error {
	return InsertDue(ctx, db, stream, taskIDs, nil)
}

// InsertDue is Insert with a due time per task: the row of taskIDs[i] is
// published once due[i] has come (a relay claims only rows whose
// next_retry_at has come), so a task delayed until tomorrow costs its row
// and nothing in Redis until then. A nil entry, or a missing one when due
// is shorter than taskIDs, means now.
func InsertDue(ctx context.Context, db Execer, stream string, taskIDs []uuid.UUID, due []*time.Time) error {
	if len(taskIDs) == 0 {
		return nil
	}
	if len(due) > len(taskIDs) {
		return fmt.Errorf("insert outbox events: %d due times for %d task ids", len(due), len(taskIDs))
	}
	if _, err := db.Exec(ctx, insertSQL, taskIDs, stream, due); err != nil {
		return fmt.Errorf("insert %d outbox events: %w", len(taskIDs), err)
	}
	return nil
}
