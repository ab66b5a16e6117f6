package task

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/transition"
)

// RevivedMessage starts the audit message of a dependent revived by the
// redrive of the dependency whose end cancelled it.
const RevivedMessage = "revived: dependency redriven"

// cancelledByDependency is the guard of a task a dependency's end
// cancelled (migration 00018, ingest_task_end_edges): t is the task, e
// its edge to that dependency.
const cancelledByDependency = `t.status = 'CANCELLED' AND t.cancel_requested_by = '` + DependencyCancelledBy + `'
      AND e.released_at IS NULL AND t.cancel_reason LIKE 'dependency ' || e.depends_on || ' ended %'`

// reviveSQL finds the dependents that the end of the tasks $1 cancelled,
// and theirs, transitively (each cancelled by the end of the one before),
// locks them in id order and moves them back to QUEUED, held: waiting_for
// counts their unreleased edges (at least the one to the task that
// cancelled them, which waits again). It returns each revived task with
// the dependency that had cancelled it. Each is made lingering, as a
// redriven task is (redriveSQL).
const reviveSQL = `
WITH RECURSIVE v(id, dep) AS (
    SELECT e.task_id, e.depends_on FROM ingest_task_dependency e JOIN ingest_task t ON t.id = e.task_id
    WHERE e.depends_on = ANY($1::uuid[]) AND ` + cancelledByDependency + `
    UNION
    SELECT e.task_id, e.depends_on FROM v JOIN ingest_task_dependency e ON e.depends_on = v.id JOIN ingest_task t ON t.id = e.task_id
    WHERE ` + cancelledByDependency + `
), l AS (
    SELECT t.id, min(v.dep::text)::uuid AS dep FROM ingest_task t JOIN v ON v.id = t.id
    GROUP BY t.id
), locked AS (
    SELECT t.id FROM ingest_task t WHERE t.id IN (SELECT id FROM l) ORDER BY t.id FOR NO KEY UPDATE
)
UPDATE ingest_task t SET status = 'QUEUED', finished_at = NULL, lingering = true, next_retry_at = NULL,
    cancel_requested_at = NULL, cancel_reason = NULL, cancel_requested_by = NULL, due_at = NULL, updated_at = now(),
    waiting_for = (SELECT count(*) FROM ingest_task_dependency e WHERE e.task_id = t.id AND e.released_at IS NULL)
FROM l JOIN locked k ON k.id = l.id
WHERE t.id = l.id AND t.status = 'CANCELLED' AND t.cancel_requested_by = '` + DependencyCancelledBy + `'
RETURNING t.id, l.dep, t.attempt_count`

// endedDependenciesSQL lists the ended dependencies ($1's unreleased
// edges to tasks that are DEAD or CANCELLED) with their ends: a revived
// task that also waits for one of those is cancelled again (or released,
// per its policy) as their end would have.
var endedDependenciesSQL = `
SELECT DISTINCT d.id, d.status FROM ingest_task_dependency e JOIN ingest_task d ON d.id = e.depends_on
WHERE e.task_id = ANY($1::uuid[]) AND e.released_at IS NULL AND d.status IN ` + redrivableSQL

// RedriveWithDependents is Redrive, and in the same transaction revives
// the dependents whose cancellation the redriven tasks' ends caused
// (their own dependents too, transitively): each goes back to QUEUED,
// held until its dependencies end again, with an audit row (CANCELLED to
// QUEUED, RevivedMessage and the dependency, worker actor). It returns
// the redrive's results and the revived tasks.
func (s *Store) RedriveWithDependents(ctx context.Context, actor string, ids ...uuid.UUID) ([]Result, []uuid.UUID, error) {
	var res []Result
	var revived []uuid.UUID
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		if res, err = s.RedriveTx(ctx, tx, actor, ids...); err != nil {
			return err
		}
		revived, err = reviveDependents(ctx, tx, s.cfg.Stream, actor, Redriven(res))
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return res, revived, nil
}

// reviveDependents runs reviveSQL for the redriven tasks ids in tx, with
// the audit rows and held outbox rows of the revived tasks.
func reviveDependents(ctx context.Context, tx pgx.Tx, stream, actor string, ids []uuid.UUID) ([]uuid.UUID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, reviveSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("revive dependents: %w", err)
	}
	var revived []uuid.UUID
	var recs []transition.Record
	for rows.Next() {
		var id, dep uuid.UUID
		var attempts int
		if err := rows.Scan(&id, &dep, &attempts); err != nil {
			rows.Close()
			return nil, fmt.Errorf("revive dependents: %w", err)
		}
		revived = append(revived, id)
		recs = append(recs, transition.Record{TaskID: id, From: string(Cancelled), To: string(Queued), AttemptCount: attempts,
			Worker: actor, Message: RevivedMessage + " " + dep.String()})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("revive dependents: %w", err)
	}
	if len(revived) == 0 {
		return nil, nil
	}
	if err := transition.Insert(ctx, tx, recs...); err != nil {
		return nil, err
	}
	if err := insertHeld(ctx, tx, stream, revived); err != nil {
		return nil, err
	}
	// The other ended dependencies of the revived tasks apply again.
	rows, err = tx.Query(ctx, endedDependenciesSQL, revived)
	if err != nil {
		return nil, fmt.Errorf("revive dependents: %w", err)
	}
	var ended []uuid.UUID
	var ends []string
	for rows.Next() {
		var id uuid.UUID
		var st string
		if err := rows.Scan(&id, &st); err != nil {
			rows.Close()
			return nil, fmt.Errorf("revive dependents: %w", err)
		}
		ended, ends = append(ended, id), append(ends, st)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("revive dependents: %w", err)
	}
	if len(ended) > 0 {
		if _, err := tx.Exec(ctx, `SELECT ingest_task_end_edges($1::uuid[], $2::text[])`, ended, ends); err != nil {
			return nil, fmt.Errorf("revive dependents: %w", err)
		}
	}
	return revived, nil
}

// DependentsRedriver redrives with RedriveWithDependents where a redrive
// through Store.Redrive is expected (dlq.Redrive, dlq.Replay), and keeps
// the tasks it revived, over all its calls.
type DependentsRedriver struct {
	Store   *Store
	Revived []uuid.UUID
}

// Redrive is Store.RedriveWithDependents.
func (r *DependentsRedriver) Redrive(ctx context.Context, actor string, ids ...uuid.UUID) ([]Result, error) {
	res, revived, err := r.Store.RedriveWithDependents(ctx, actor, ids...)
	r.Revived = append(r.Revived, revived...)
	return res, err
}
