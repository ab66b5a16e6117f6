package task

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ingest-worker/ingest/outbox"
)

// entryRowsSQL gives the outbox rows (task_id, id) published as entry ids
// $2 of stream $1: those of outbox_row by its stream_id index, those of
// the outbox log (migration 00039) through the batches recorded between
// $3 and $4, which bound when the entries were added (entryWindow).
const entryRowsSQL = `
    SELECT e.task_id, e.id FROM outbox_row e WHERE e.stream = $1 AND e.stream_id = ANY($2::text[])
    UNION ALL
    SELECT l.task_id, l.id FROM outbox_log_batch b
    CROSS JOIN LATERAL unnest(b.event_ids, b.stream_ids, b.streams) AS u(id, sid, dest)
    JOIN outbox_log l ON l.id = u.id
    WHERE b.sent_at BETWEEN $3 AND $4 AND u.dest = $1 AND u.sid = ANY($2::text[])`

// republishSQL returns the tasks to republish for deleted entry ids ($2) of
// a stream ($1, batch times $3 to $4): the task of each id's outbox event,
// when the task is not terminal and has no later outbox event (a later
// event already carries it: an entry in the stream, or one still to be
// published).
var republishSQL = `
WITH gone AS (
    SELECT DISTINCT ON (e.task_id) e.task_id, e.id AS event_id
    FROM (` + entryRowsSQL + `) e
    ORDER BY e.task_id, e.id DESC
)
SELECT t.id
FROM gone g JOIN ingest_task t ON t.id = g.task_id
WHERE t.status NOT IN ` + terminalSQL + `
  AND NOT EXISTS (SELECT 1 FROM outbox_event l WHERE l.task_id = g.task_id AND l.id > g.event_id)
ORDER BY t.id`

// matchedSQL counts the deleted entry ids ($2) of a stream ($1, batch
// times $3 to $4) that have an outbox event.
const matchedSQL = `SELECT count(*) FROM (` + entryRowsSQL + `) e`

// entrySlack is how far from an entry's time (the milliseconds of its
// id) the batch that recorded its publish may be: the batch's time is
// taken after the XADD, by the database's clock.
const entrySlack = 5 * time.Minute

// entryWindow bounds when the batches that recorded entries ids were
// written: from the earliest id's time to the latest's, widened by
// entrySlack. Ids that are not Redis entry ids (ms-seq) leave it
// unbounded.
func entryWindow(ids []string) (from, to pgtype.Timestamptz) {
	unbounded := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	var lo, hi int64
	for i, id := range ids {
		ms, _, _ := strings.Cut(id, "-")
		n, err := strconv.ParseInt(ms, 10, 64)
		if err != nil || n < 0 {
			return unbounded, pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
		}
		if i == 0 || n < lo {
			lo = n
		}
		if i == 0 || n > hi {
			hi = n
		}
	}
	return pgtype.Timestamptz{Time: time.UnixMilli(lo).Add(-entrySlack), Valid: true},
		pgtype.Timestamptz{Time: time.UnixMilli(hi).Add(entrySlack), Valid: true}
}

// RepublishDeleted maps entry ids of stream that were trimmed or deleted
// while pending back to their tasks, and gives each task that still has to
// run (not terminal, no later outbox event) a new outbox event to to (the
// task stream, whose relay publishes each task to the stream of its
// priority: stream itself, or another level's), in one transaction. It returns the tasks republished and how many of the
// ids matched an outbox event at all. A republished task that turns out to
// be finished or running elsewhere by the time its new entry is read is
// harmless: starting a task is a guarded transition.
func RepublishDeleted(ctx context.Context, db DB, stream, to string, entryIDs []string) (tasks []uuid.UUID, matched int, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := outbox.LockForWrite(ctx, tx); err != nil {
			return err
		}
		since, until := entryWindow(entryIDs)
		if err := tx.QueryRow(ctx, matchedSQL, stream, entryIDs, since, until).Scan(&matched); err != nil {
			return fmt.Errorf("look up outbox events: %w", err)
		}
		if matched == 0 {
			tasks = nil
			return nil
		}
		rows, err := tx.Query(ctx, republishSQL, stream, entryIDs, since, until)
		if err != nil {
			return fmt.Errorf("find tasks to republish: %w", err)
		}
		if tasks, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
			return fmt.Errorf("find tasks to republish: %w", err)
		}
		return outbox.Insert(ctx, tx, to, tasks...)
	})
	if err != nil {
		return nil, 0, err
	}
	return tasks, matched, nil
}
