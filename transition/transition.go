package transition

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what Insert and List need: a pool, a connection or a pgx.Tx.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Record is one row of ingest_task_transition.
type Record struct {
	ID           int64     `json:"id"`
	TaskID       uuid.UUID `json:"task_id"`
	From         string    `json:"from_status,omitempty"` // "" when the task was created
	To           string    `json:"to_status"`
	AttemptCount int       `json:"attempt_count"` // the task's attempt_count after the change
	Message      string    `json:"message,omitempty"`
	Worker       string    `json:"worker,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
}

// insertSQL writes the rows whose task exists (no foreign key checks that:
// it would lock the task row, a WAL record per audit row; the probe of the
// task's primary key writes nothing), in the order given, so their ids
// follow it.
//
// The OFFSET 0 keeps the EXISTS a probe per row: without it the planner
// may turn it into a join, and on a task table never analyzed (fresh,
// restored or truncated; it then assumes ten pages) it chose a hash join
// over a sequential scan of every task, a plan the prepared statement
// kept as the table grew. A probe can only read the primary key or scan
// the table per row, and the probe is the cheaper of the two.
const insertSQL = `
INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, worker)
SELECT task_id, NULLIF(from_status, ''), to_status, attempt_count, NULLIF(message, ''), NULLIF(worker, '')
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::text[], $6::text[]) WITH ORDINALITY
    AS r(task_id, from_status, to_status, attempt_count, message, worker, ord)
WHERE EXISTS (SELECT 1 FROM ingest_task t WHERE t.id = r.task_id OFFSET 0)
ORDER BY ord`

// Insert writes recs in one statement. Call it with the transaction that
// made the state changes; ID and CreatedAt of recs are ignored. A record
// of a task that does not exist is an error (the caller rolls back).
func Insert(ctx context.Context, db DBTX, recs ...Record) error {
	if len(recs) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(recs))
	from := make([]string, len(recs))
	to := make([]string, len(recs))
	attempts := make([]int32, len(recs))
	msgs := make([]string, len(recs))
	workers := make([]string, len(recs))
	for i, r := range recs {
		ids[i], from[i], to[i], attempts[i], msgs[i], workers[i] = r.TaskID, r.From, r.To, int32(r.AttemptCount), r.Message, r.Worker
	}
	tag, err := db.Exec(ctx, insertSQL, ids, from, to, attempts, msgs, workers)
	if err != nil {
		return fmt.Errorf("insert %d transitions: %w", len(recs), err)
	}
	if n := tag.RowsAffected(); n != int64(len(recs)) {
		return fmt.Errorf("insert %d transitions: %d of them name no task", len(recs), int64(len(recs))-n)
	}
	return nil
}

const listSQL = `
SELECT id, task_id, coalesce(from_status, ''), to_status, attempt_count, coalesce(message, ''), coalesce(worker, ''), created_at
FROM ingest_task_transition WHERE task_id = $1 ORDER BY id`

// List returns the transitions of one task, oldest first.
func List(ctx context.Context, db DBTX, taskID uuid.UUID) ([]Record, error) {
	rows, err := db.Query(ctx, listSQL, taskID)
	if err != nil {
		return nil, fmt.Errorf("list transitions of %s: %w", taskID, err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		err := row.Scan(&r.ID, &r.TaskID, &r.From, &r.To, &r.AttemptCount, &r.Message, &r.Worker, &r.CreatedAt)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("list transitions of %s: %w", taskID, err)
	}
	return recs, nil
}
