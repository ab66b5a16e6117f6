package outbox

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is what Insert needs: a pool, a connection or a pgx.Tx.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

const insertSQL = `
INSERT INTO outbox_event (task_id, stream)
SELECT id, $2 FROM unnest($1::uuid[]) AS t(id)`

// Insert writes one NEW outbox_event per task, to be published to stream.
// Call it in the transaction that creates (or redrives) the tasks: the rows
// become visible, and the relays are notified, only when it commits.
func Insert(ctx context.Context, db Execer, stream string, taskIDs ...uuid.UUID) error {
	if len(taskIDs) == 0 {
		return nil
	}
	if _, err := db.Exec(ctx, insertSQL, taskIDs, stream); err != nil {
		return fmt.Errorf("insert %d outbox events: %w", len(taskIDs), err)
	}
	return nil
}
