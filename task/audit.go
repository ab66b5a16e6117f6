package task

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// The statements of this file read the audit table for charts (package
// ui): which audit rows are successes is a question of task states, so
// the SQL lives here.

// auditWindowStartSQL returns the id just before the first audit row
// created in the last $1 ms, found on the BRIN index of created_at (the
// table is only appended to).
const auditWindowStartSQL = `
SELECT coalesce(min(id) - 1, 0) FROM ingest_task_transition
WHERE created_at >= now() - $1 * interval '1 millisecond'`

// AuditWindowStart returns the id after which the audit rows of the last
// window begin (0 when there are none).
func AuditWindowStart(ctx context.Context, db DB, window time.Duration) (int64, error) {
	var id int64
	if err := db.QueryRow(ctx, auditWindowStartSQL, window.Milliseconds()).Scan(&id); err != nil {
		return 0, fmt.Errorf("audit window start: %w", err)
	}
	return id, nil
}

// auditSamplesSQL aggregates the audit rows after id $1 (at most $2 of
// them, in id order; only those created since $4, so that the BRIN index
// of created_at limits the read to the table's last pages) per bucket of
// $3 seconds, kind, state reached and creation, with the latency of the
// SUCCEEDED rows: from when the task's life became due to its success
// (greatest(created_at, due_at): due_at is NULL for a task due at its
// creation, and a delayed, run-now or redriven task's latency starts at
// its due time, not at its creation). The task's kind and due time come
// by primary key (a LATERAL probe: a join could be planned as a scan of
// the task table), and only for the rows counted by kind (SUCCEEDED,
// RETRYING, DEAD): creations, starts and cancellations, two thirds of the
// rows, are counted with the kind "". Times are seconds in double
// precision (date_part): extract() computes in numeric, which took a
// third of the statement's time. The row of a run-now (a waiting state
// to itself, Store.RunNow) is no transition: it is read, so that the
// window moves past it, but not counted (a RETRYING one would count as a
// failure).
var auditSamplesSQL = `
WITH n AS (
    SELECT id, task_id, from_status, to_status, created_at FROM ingest_task_transition
    WHERE id > $1 AND created_at >= $4 ORDER BY id LIMIT $2
)
SELECT max(n.id), max(n.created_at), floor(date_part('epoch', n.created_at) / $3)::bigint, coalesce(t.kind, ''), n.to_status, n.from_status IS NULL,
       count(*) FILTER (WHERE n.from_status IS DISTINCT FROM n.to_status OR n.to_status NOT IN ` + waitingSQL + `),
       coalesce(sum(date_part('epoch', n.created_at - t.due)) FILTER (WHERE n.to_status = '` + string(Succeeded) + `'), 0),
       coalesce(max(date_part('epoch', n.created_at - t.due)) FILTER (WHERE n.to_status = '` + string(Succeeded) + `'), 0)
FROM n LEFT JOIN LATERAL (
    SELECT kind, greatest(created_at, due_at) AS due FROM ingest_task
    WHERE id = n.task_id AND n.to_status IN ('` + string(Succeeded) + `', '` + string(Retrying) + `', '` + string(Dead) + `') LIMIT 1) t ON true
GROUP BY 3, 4, 5, 6`

// AuditSample is one group of audit rows of AuditSamples.
type AuditSample struct {
	// MaxID and MaxAt are the group's newest id and created_at.
	MaxID int64
	MaxAt time.Time
	// Bucket is the rows' created_at in seconds divided by the bucket
	// length.
	Bucket int64
	// Kind is the tasks' kind for rows that reached SUCCEEDED, RETRYING
	// or DEAD, and "" for the others (it is not read for them).
	Kind string
	// To is the state the rows reached; Created: they are creations.
	To      State
	Created bool
	N       int64
	// LatSum and LatMax are the sum and the maximum, in seconds, of the
	// time from due to SUCCEEDED of the rows that reached it: from the
	// task's creation, or from its due_at when later (a delayed task's
	// first due time, its last run-now or redrive).
	LatSum, LatMax float64
}

// AuditSamples aggregates up to limit audit rows after id afterID that
// were created since since, by bucket of the given length, kind, state
// reached and creation.
func AuditSamples(ctx context.Context, db DB, afterID int64, since time.Time, limit int, bucket time.Duration) ([]AuditSample, error) {
	rows, err := pgplan.QueryRead(ctx, db, auditSamplesSQL, afterID, limit, int64(bucket/time.Second), since)
	if err != nil {
		return nil, fmt.Errorf("audit samples: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditSample, error) {
		var a AuditSample
		err := r.Scan(&a.MaxID, &a.MaxAt, &a.Bucket, &a.Kind, &a.To, &a.Created, &a.N, &a.LatSum, &a.LatMax)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("audit samples: %w", err)
	}
	return out, nil
}
