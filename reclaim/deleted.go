package reclaim

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/outbox"
)

// republishSQL returns the tasks to republish for deleted entry ids ($2) of
// a stream ($1): the task of each id's outbox event, when the task is not
// terminal and has no later outbox event (a later event already carries it:
// an entry in the stream, or one still to be published).
const republishSQL = `
WITH gone AS (
    SELECT DISTINCT ON (e.task_id) e.task_id, e.id AS event_id
    FROM outbox_event e
    WHERE e.stream = $1 AND e.stream_id = ANY($2::text[])
    ORDER BY e.task_id, e.id DESC
)
SELECT t.id
FROM gone g JOIN ingest_task t ON t.id = g.task_id
WHERE t.status NOT IN ('SUCCEEDED', 'DEAD')
  AND NOT EXISTS (SELECT 1 FROM outbox_event l WHERE l.task_id = g.task_id AND l.id > g.event_id)
ORDER BY t.id`

// matchedSQL counts the deleted entry ids ($2) of a stream ($1) that have
// an outbox event.
const matchedSQL = `SELECT count(*) FROM outbox_event WHERE stream = $1 AND stream_id = ANY($2::text[])`

// republish maps deleted entry ids of the stream back to their tasks and
// inserts a new outbox event for each task that still has to run, in one
// transaction. It returns the tasks republished and how many ids matched an
// outbox event. A republished task that turns out to be finished or running
// elsewhere by the time its new entry is read is harmless: starting a task
// is a guarded transition.
func (r *Reclaimer) republish(ctx context.Context, ids []string) (tasks []uuid.UUID, matched int, err error) {
	err = pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, matchedSQL, r.cfg.Stream, ids).Scan(&matched); err != nil {
			return fmt.Errorf("look up outbox events: %w", err)
		}
		if matched == 0 {
			tasks = nil
			return nil
		}
		rows, err := tx.Query(ctx, republishSQL, r.cfg.Stream, ids)
		if err != nil {
			return fmt.Errorf("find tasks to republish: %w", err)
		}
		if tasks, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
			return fmt.Errorf("find tasks to republish: %w", err)
		}
		return outbox.Insert(ctx, tx, r.cfg.Stream, tasks...)
	})
	if err != nil {
		return nil, 0, err
	}
	return tasks, matched, nil
}

// republishTimeout bounds one republish transaction.
const republishTimeout = 10 * time.Second

// handleDeleted republishes the tasks of deleted entry ids and returns how
// many tasks it republished. Ids it could not handle (Postgres error) go to
// the backlog and are retried next round.
//
// XAUTOCLAIM has already removed the ids from the PEL, so the write is not
// cut short by ctx (shutdown): it gets republishTimeout of its own.
func (r *Reclaimer) handleDeleted(ctx context.Context, ids []string) int {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), republishTimeout)
	defer cancel()
	tasks, matched, err := r.republish(ctx, ids)
	if err != nil {
		r.metrics.add(resultError, 1)
		r.logger.Error("republish tasks of deleted stream entries: retrying next round",
			"ids", len(ids), "message_id", ids[0], "err", fmt.Errorf("republish %d deleted entries of %s: %w", len(ids), r.cfg.Stream, err))
		r.toBacklog(ids)
		return 0
	}
	if unknown := len(ids) - matched; unknown > 0 {
		r.logger.Warn("deleted stream entries without an outbox event: not republished", "ids", unknown)
	}
	for _, id := range tasks {
		r.logger.Debug("republished task of a deleted stream entry", "task_id", id)
	}
	return len(tasks)
}

func (r *Reclaimer) toBacklog(ids []string) {
	r.backlog = append(r.backlog, ids...)
	if over := len(r.backlog) - maxBacklog; over > 0 {
		r.logger.Error("too many deleted stream entries to republish: dropping the oldest (the outbox rescuer republishes their tasks)",
			"ids", over, "message_id", r.backlog[0])
		r.backlog = append([]string(nil), r.backlog[over:]...)
	}
}
