package outbox

import (
	"context"
	"fmt"
	"time"
)

// Stats describes the outbox for an operator.
type Stats struct {
	// Unsent counts NEW and RETRYING rows; OldestUnsent is the created_at
	// of the oldest of them (nil when none).
	Unsent       int64
	OldestUnsent *time.Time
	// Dead counts rows whose publishing gave up.
	Dead int64
}

const statsSQL = `
SELECT count(*) FILTER (WHERE status IN ('NEW', 'RETRYING')),
       min(created_at) FILTER (WHERE status IN ('NEW', 'RETRYING')),
       count(*) FILTER (WHERE status = 'DEAD')
FROM outbox_event`

// ReadStats reads the outbox's Stats (one scan of outbox_event: for the
// CLI, not for a hot path).
func ReadStats(ctx context.Context, db Querier) (Stats, error) {
	var s Stats
	rows, err := db.Query(ctx, statsSQL)
	if err != nil {
		return s, fmt.Errorf("read the outbox backlog: %w", err)
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&s.Unsent, &s.OldestUnsent, &s.Dead); err != nil {
			return s, fmt.Errorf("read the outbox backlog: %w", err)
		}
	}
	return s, rows.Err()
}
