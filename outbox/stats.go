package outbox

import (
	"context"
	"fmt"
)

// Stats describes the outbox for an operator.
type Stats struct {
	// Backlog counts the unsent rows: due (and how long the oldest has
	// waited) and scheduled (delayed tasks' rows not yet due).
	Backlog
	// Dead counts rows whose publishing gave up.
	Dead int64
}

// deadSQL counts the DEAD rows on outbox_event_dead_idx (migration 00037),
// which only they enter: an index-only scan of each partition's. Without
// it the count read every partition whole for a few rows. It names the
// table: the outbox log's rows are never DEAD (a failed publish moves a
// row into outbox_row), and the view would read every one of them.
const deadSQL = `SELECT count(*) FROM outbox_row WHERE status = 'DEAD'`

// ReadStats reads the outbox's Stats (every unsent and every DEAD row: for
// the CLI, not for a hot path).
func ReadStats(ctx context.Context, db RowQuerier) (Stats, error) {
	var s Stats
	var err error
	if s.Backlog, err = ReadBacklog(ctx, db, 0); err != nil {
		return s, err
	}
	if err := db.QueryRow(ctx, deadSQL).Scan(&s.Dead); err != nil {
		return s, fmt.Errorf("read the outbox's DEAD rows: %w", err)
	}
	return s, nil
}
