package task

import (
	"context"
	"fmt"

	"github.com/google/uuid"
)

// CountByStatus counts tasks per state, every state present (0 when none):
// the tasks of ids, or every task when ids is empty.
func (s *Store) CountByStatus(ctx context.Context, ids ...uuid.UUID) (map[State]int64, error) {
	sql, args := `SELECT status, count(*) FROM ingest_task GROUP BY status`, []any(nil)
	if len(ids) > 0 {
		sql, args = `SELECT status, count(*) FROM ingest_task WHERE id = ANY($1) GROUP BY status`, []any{ids}
	}
	rows, err := s.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("count tasks: %w", err)
	}
	defer rows.Close()
	out := make(map[State]int64, len(States))
	for _, st := range States {
		out[st] = 0
	}
	for rows.Next() {
		var st State
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("count tasks: %w", err)
		}
		out[st] = n
	}
	return out, rows.Err()
}
