package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/outbox"
)

// The statements of this file serve the rescuer (package maintenance),
// which finds tasks that should be in Redis but are not and gives each a
// new outbox row. Which task is a candidate is a question of task states,
// so the SQL lives here.

// RescueClass is a kind of rescue candidate. Every class is paged by id
// over the unfinished tasks (liveTasks: the recent ids on the primary key
// and the lingering tasks on their index), each pass reading the states it
// looks for.
type RescueClass int

const (
	// RescueQueued: QUEUED tasks.
	RescueQueued RescueClass = iota
	// RescueRetrying: RETRYING tasks; those not yet due come back
	// ineligible.
	RescueRetrying
	// RescueRunning: RUNNING tasks whose lease expired.
	RescueRunning
)

// RescueClasses lists every class, in the order a rescuer pass walks them.
var RescueClasses = []RescueClass{RescueQueued, RescueRetrying, RescueRunning}

func (c RescueClass) String() string {
	switch c {
	case RescueQueued:
		return "queued"
	case RescueRetrying:
		return "retrying"
	case RescueRunning:
		return "running"
	}
	return fmt.Sprintf("RescueClass(%d)", int(c))
}

// RescueCursor is a keyset position among the unfinished tasks: the page
// after it starts past ID. The zero cursor is the start.
type RescueCursor struct {
	ID uuid.UUID
}

// RescueCandidate is one examined task with its latest outbox row.
type RescueCandidate struct {
	ID     uuid.UUID
	Status State
	// LastOutboxID is the id of the task's latest outbox row (0: none).
	LastOutboxID int64
	// Stream and StreamID are that row's stream and entry id ("" when the
	// row was never published, or there is none).
	Stream   string
	StreamID string
	// Eligible: due, no unsent outbox row, and the latest row SENT (or
	// DEAD) more than the grace ago, or no row at all and the task
	// untouched for as long. Only eligible candidates may be rescued.
	Eligible bool
}

// RescuePage is one page of a class: the candidates among the next
// unfinished tasks after a cursor.
type RescuePage struct {
	Candidates []RescueCandidate
	// Next is the cursor after the tasks the page read.
	Next RescueCursor
	// More: the page read as many tasks as it was allowed, so more may
	// follow; false means the class is exhausted (the next page starts
	// over at the zero cursor).
	More bool
}

// rescueColumns are the columns of a candidate in rescueWindowSQL: each
// task with its latest outbox row (lo) and whether it is eligible (due,
// no unsent row, latest row SENT (or DEAD) more than $3 ms ago, or no row
// at all). $1: keyset cursor (id); $2: page size; $3: grace in ms.
//
// The window's lateral reads a task's outbox rows through outbox_event_task_idx only:
// the latest row and, as a window count over all of them, the unsent ones.
// A separate "count unsent rows of this task" subquery let the planner
// pick the claim index (unsent rows, any task) and filter it on task_id,
// which is O(unsent rows) per candidate, and while a backlog is relayed
// that index is large and full of dead entries: one page took 6.6 s.
var rescueColumns = `
SELECT t.id, t.status, coalesce(lo.id, 0), coalesce(lo.stream, ''), coalesce(lo.stream_id, ''),
    (t.status = 'RUNNING' OR ` + due("t") + `)
    AND coalesce(lo.unsent, 0) = 0
    AND CASE WHEN lo.id IS NULL THEN t.updated_at < now() - $3 * interval '1 millisecond'
             WHEN lo.status = 'DEAD' THEN lo.created_at < now() - $3 * interval '1 millisecond'
             ELSE lo.status = 'SENT' AND lo.sent_at < now() - $3 * interval '1 millisecond' END`

// rescueWindowSQL reads the next $2 unfinished tasks after id $1 in id
// order that were created more than the grace ($3 ms) ago: the next $2 of
// each arm of liveTasks, each an ordered range of its index (the primary
// key from the low water up to the id of now() minus the grace, and
// ingest_task_lingering_idx), and the first $2 of both (materialized, so
// that the page is those ordered index ranges whatever the planner thinks
// of the states), and returns the last id it read and how many, with the
// candidates of a class among them (%s: the class's guard on t), if any.
//
// A task created less than the grace ago cannot be eligible: each case of
// rescueColumns needs a time at or after the task's creation (its latest
// outbox row's sent_at or created_at, or its updated_at) to be more than
// the grace old. So the recent arm ends at the id of now() minus the
// grace; it used to walk every task above the low water, finished or not,
// about a minute of tasks per page (450 ms a page at 1,500 tasks/s, more
// while a held transaction keeps their dead versions). The one exception
// only waits longer: an outbox row dated by a transaction that began
// before its task's id was taken (Store.CreateTx) is found once the id is
// the grace old.
var rescueWindowSQL = `
WITH w AS MATERIALIZED (
    SELECT u.id FROM (
        (SELECT lr.id FROM ingest_task lr WHERE lr.id > $1 AND lr.id < ` + idAtSQL(nowMinusMSSQL("$3::bigint")) + `
            AND ` + recentGuard("lr") + ` ORDER BY lr.id LIMIT $2)
        UNION ALL
        (SELECT ll.id FROM ingest_task ll WHERE ll.id > $1 AND ` + lingeringGuard("ll") + ` ORDER BY ll.id LIMIT $2)
    ) u ORDER BY u.id LIMIT $2
), s AS (
    SELECT (SELECT id FROM w ORDER BY id DESC LIMIT 1) AS last, (SELECT count(*) FROM w) AS n
)
SELECT s.last, s.n, c.* FROM s LEFT JOIN LATERAL (%s
    FROM w JOIN ingest_task t ON t.id = w.id
    LEFT JOIN LATERAL (
        SELECT o.id, o.status, o.stream, o.stream_id, o.sent_at, o.created_at,
               count(*) FILTER (WHERE o.status IN ('NEW', 'RETRYING')) OVER () AS unsent
        FROM outbox_event o
        WHERE o.task_id = t.id ORDER BY o.id DESC LIMIT 1
    ) lo ON true
    WHERE %s
) c ON true
ORDER BY c.id`

// RescuePlanSQL, sent in a page's round trip and implicit transaction,
// leaves the planner one way to read the window: the primary key from the
// low water and ingest_task_lingering_idx, each in id order, stopping
// after the page. A queue table's statistics are often
// far off (a backlog arrives faster than ANALYZE, or autovacuum is off or
// held back by an open transaction), and a plan that thinks the table is
// small scans it whole, on every page. The settings end with the
// transaction.
const RescuePlanSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// rescueSQL holds the candidate query of each class. Every class reads
// the same unfinished tasks, so a pass costs O(unfinished tasks) per
// class, each page O(page).
var rescueSQL = map[RescueClass]string{
	RescueQueued:   fmt.Sprintf(rescueWindowSQL, rescueColumns, `t.status = 'QUEUED'`),
	RescueRetrying: fmt.Sprintf(rescueWindowSQL, rescueColumns, `t.status = 'RETRYING'`), // not yet due: ineligible
	RescueRunning:  fmt.Sprintf(rescueWindowSQL, rescueColumns, expiredLease("t")),
}

// RescueCandidates returns a page of class: its candidates among the next
// limit unfinished tasks after the cursor created more than grace ago, in
// id order, each with whether it is eligible given grace (see
// RescueCandidate.Eligible).
func RescueCandidates(ctx context.Context, db DB, class RescueClass, after RescueCursor, limit int, grace time.Duration) (RescuePage, error) {
	sql, ok := rescueSQL[class]
	if !ok {
		return RescuePage{}, fmt.Errorf("find rescue candidates: unknown class %d", int(class))
	}
	var page RescuePage
	var last *uuid.UUID
	var read int
	batch := &pgx.Batch{}
	batch.Queue(RescuePlanSQL)
	batch.Queue(sql, after.ID, limit, grace.Milliseconds())
	br := db.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			for rows.Next() {
				var id *uuid.UUID
				var st *State
				var outboxID *int64
				var stream, streamID *string
				var eligible *bool
				if err = rows.Scan(&last, &read, &id, &st, &outboxID, &stream, &streamID, &eligible); err != nil {
					break
				}
				if id != nil {
					page.Candidates = append(page.Candidates, RescueCandidate{ID: *id, Status: *st, LastOutboxID: *outboxID,
						Stream: *stream, StreamID: *streamID, Eligible: *eligible})
				}
			}
			rows.Close()
			err = errors.Join(err, rows.Err())
		}
	}
	if err = errors.Join(err, br.Close()); err != nil {
		return RescuePage{}, fmt.Errorf("find %s rescue candidates: %w", class, err)
	}
	if last != nil {
		page.Next = RescueCursor{ID: *last}
	}
	page.More = read >= limit
	return page, nil
}

// lockTasksSQL locks the candidate tasks in id order (the order the task
// store locks in), so the re-check below reads their committed state.
const lockTasksSQL = `SELECT id FROM ingest_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE`

// stillMissingSQL re-checks, under the row locks, that each candidate is
// still a candidate and that no outbox row was added since it was examined
// (its latest row is still $2). It reads the latest id of each of
// outbox_event's tables by its task index: through the view, the planner
// would read the log's rows whole.
var stillMissingSQL = `
SELECT t.id FROM ingest_task t
JOIN unnest($1::uuid[], $2::bigint[]) AS c(id, last_id) ON c.id = t.id
WHERE (` + startable("t", "\n       ") + `)
  AND greatest(coalesce((SELECT max(o.id) FROM outbox_row o WHERE o.task_id = t.id), 0),
               coalesce((SELECT max(l.id) FROM outbox_log l WHERE l.task_id = t.id), 0)) = c.last_id`

// Rescue gives each candidate that is still one a new outbox row to
// stream, in one transaction, and returns the ids it rescued. It locks
// the tasks in id order and re-checks them under the locks: a task that
// started, finished or gained an outbox row since it was examined (its
// latest row is no longer LastOutboxID) is left alone, so any number of
// rescuers may run at once.
func Rescue(ctx context.Context, db DB, stream string, cands []RescueCandidate) ([]uuid.UUID, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	ids := make([]uuid.UUID, len(cands))
	lastIDs := make([]int64, len(cands))
	for i, c := range cands {
		ids[i], lastIDs[i] = c.ID, c.LastOutboxID
	}
	var still []uuid.UUID
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := outbox.LockForWrite(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, lockTasksSQL, ids); err != nil {
			return err
		}
		// The re-check reads the tables by their task indexes only, as
		// the pages do, whatever the statistics say of them.
		if _, err := tx.Exec(ctx, RescuePlanSQL); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, stillMissingSQL, ids, lastIDs)
		if err != nil {
			return err
		}
		if still, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID]); err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, stream, still...)
	})
	if err != nil {
		return nil, fmt.Errorf("rescue %d tasks to %s: %w", len(cands), stream, err)
	}
	return still, nil
}
