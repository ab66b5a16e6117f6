package task

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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

// cappedCountsSQL counts up to $1 tasks in each of states, one probe per
// state on the source and index that hold it (stateSource, stateScope), so
// the cost is bounded by the cap whatever the table holds.
func cappedCountsSQL(states []State) string {
	parts := make([]string, len(states))
	for i, s := range states {
		parts[i] = `SELECT '` + string(s) + `'::text, (SELECT count(*) FROM (SELECT 1 FROM ` + stateSource("t", s) + ` WHERE t.status = '` +
			string(s) + `' AND ` + stateScope("t", s) + ` LIMIT $1) x)`
	}
	return strings.Join(parts, "\nUNION ALL\n")
}

// CappedCounts counts the tasks in each of states, up to limit each: a
// count of limit means "limit or more".
func CappedCounts(ctx context.Context, db DB, states []State, limit int) (map[State]int64, error) {
	out := make(map[State]int64, len(states))
	if len(states) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, cappedCountsSQL(states), limit)
	if err != nil {
		return nil, fmt.Errorf("count tasks: %w", err)
	}
	var st string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { out[State(st)] = n; return nil }); err != nil {
		return nil, fmt.Errorf("count tasks: %w", err)
	}
	return out, nil
}

// liveCountsSQL reads at most $1 unfinished tasks in one walk of
// liveTasks (the primary key from the low water, where the cost is the
// walk over the last minute's tasks, finished or not, and the lingering
// ones) and counts them by state and kind.
var liveCountsSQL = `
WITH l AS MATERIALIZED (SELECT t.status, t.kind FROM ` + liveTasks("t") + ` LIMIT $1)
SELECT status, kind, count(*) FROM l GROUP BY 1, 2`

// LiveCounts counts the unfinished tasks (QUEUED, RUNNING, RETRYING) by
// state and by kind (kind → state → count), reading at most limit of them
// in one walk: CappedCounts and NewestByKind walk the same range once per
// state and query. complete is false when it read limit tasks: there may
// be more, and a caller that needs each state counted apart (a backlog of
// one state must not cap the others) uses those two then.
func LiveCounts(ctx context.Context, db DB, limit int) (byState map[State]int64, byKind map[string]map[State]int64, complete bool, err error) {
	rows, err := db.Query(ctx, liveCountsSQL, limit)
	if err != nil {
		return nil, nil, false, fmt.Errorf("count unfinished tasks: %w", err)
	}
	byState, byKind = map[State]int64{}, map[string]map[State]int64{}
	var st, k string
	var n, total int64
	_, err = pgx.ForEachRow(rows, []any{&st, &k, &n}, func() error {
		byState[State(st)] += n
		if byKind[k] == nil {
			byKind[k] = map[State]int64{}
		}
		byKind[k][State(st)] = n
		total += n
		return nil
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("count unfinished tasks: %w", err)
	}
	return byState, byKind, total < int64(limit), nil
}

// newestByKindSQL counts the newest $1 tasks of each of states by kind,
// one probe per state as in cappedCountsSQL.
func newestByKindSQL(states []State) string {
	parts := make([]string, len(states))
	for i, s := range states {
		parts[i] = `SELECT '` + string(s) + `'::text, x.kind, count(*) FROM (SELECT t.kind FROM ` + stateSource("t", s) + ` WHERE t.status = '` +
			string(s) + `' AND ` + stateScope("t", s) + ` ORDER BY t.id DESC LIMIT $1) x GROUP BY x.kind`
	}
	return strings.Join(parts, "\nUNION ALL\n")
}

// NewestByKind counts, for each of states, its newest limit tasks by
// kind: kind → state → count.
func NewestByKind(ctx context.Context, db DB, states []State, limit int) (map[string]map[State]int64, error) {
	out := map[string]map[State]int64{}
	if len(states) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, newestByKindSQL(states), limit)
	if err != nil {
		return nil, fmt.Errorf("count tasks by kind: %w", err)
	}
	var st, k string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&st, &k, &n}, func() error {
		if out[k] == nil {
			out[k] = map[State]int64{}
		}
		out[k][State(st)] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count tasks by kind: %w", err)
	}
	return out, nil
}
