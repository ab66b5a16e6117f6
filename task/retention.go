package task

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/stream"
)

// deleteKindSQL deletes every task of kind $1 with its audit and outbox
// rows, those of the outbox log too (no foreign key cascades them: package
// task writes them with the task and deletes them with it).
const deleteKindSQL = `
WITH t AS (DELETE FROM ingest_task WHERE kind = $1 RETURNING id),
a AS (DELETE FROM ingest_task_transition WHERE task_id IN (SELECT id FROM t)),
o AS (DELETE FROM outbox_row WHERE task_id IN (SELECT id FROM t)),
l AS (DELETE FROM outbox_log WHERE task_id IN (SELECT id FROM t))
SELECT count(*) FROM t`

// DeleteKind deletes every task of kind, with its audit trail and outbox
// rows, in one statement, and returns how many tasks it deleted. It is for
// throwaway kinds (a benchmark's); an operator's tasks are kept.
func DeleteKind(ctx context.Context, db DB, kind string) (int, error) {
	var n int
	if err := db.QueryRow(ctx, deleteKindSQL, kind).Scan(&n); err != nil {
		return 0, fmt.Errorf("delete the tasks of kind %q: %w", kind, err)
	}
	return n, nil
}

// Windows are how long the finished tasks of each terminal state are kept
// after finished_at: Retention deletes a task once its window has passed.
// A negative window keeps the tasks of that state forever (KeepForever).
type Windows struct {
	Succeeded time.Duration
	Cancelled time.Duration
	Dead      time.Duration
}

// KeepForever is the window of a state whose tasks are never deleted.
const KeepForever time.Duration = -1

// ms is the window in milliseconds as the SQL takes it: -1 keeps forever.
func (w Windows) ms() (succeeded, cancelled, dead int64) {
	f := func(d time.Duration) int64 {
		if d < 0 {
			return -1
		}
		return d.Milliseconds()
	}
	return f(w.Succeeded), f(w.Cancelled), f(w.Dead)
}

// Deleted is a task deleted, by DeleteTerminal with its audit and outbox
// rows, by DeleteExpired without them (see expiredSQL).
type Deleted struct {
	ID     uuid.UUID
	Status State
	// Entries are the stream entries its deleted outbox rows had
	// published, oldest first (see DeleteResult.Entries).
	Entries []stream.EntryRef
}

// entryRefs pairs the parallel stream and id arrays of the CTE d
// (finishedCTEs).
func entryRefs(streams, ids []string) []stream.EntryRef {
	if len(ids) == 0 {
		return nil
	}
	out := make([]stream.EntryRef, len(ids))
	for i := range ids {
		out[i] = stream.EntryRef{Stream: streams[i], ID: ids[i]}
	}
	return out
}

// finishedCTEs deletes the tasks of the CTE pick (a column id) that are
// finished and, when rows is true, their audit and outbox rows (no
// foreign key cascades them: package task writes them with the task and
// deletes them with it); the CTE t holds the id and state of each task
// deleted, and the CTE d the same with the stream entries its outbox rows
// had published (streams and stream_ids, parallel arrays in outbox row
// order; empty when none was published), read whether or not the rows
// are deleted. A task that is not finished is never deleted, whatever
// pick holds: the guard is on the DELETE itself, so a task redriven
// concurrently is re-checked on its new version and kept. The one
// deletion of tasks: retention's batches (expiredSQL, without the rows:
// they go with their partitions, and the outbox log's with its pruning)
// and an operator's delete by id
// (deleteTerminalSQL, with them).
func finishedCTEs(rows bool) string {
	// Without the rows, each task's outbox rows are read by a probe of
	// outbox_event_task_idx in each partition: a LATERAL subquery that
	// OFFSET 0 keeps from being flattened into a join, which the planner
	// made a hash join over every partition's index, read whole.
	a, o := "", `
o AS (SELECT e.id, e.task_id, e.stream, e.stream_id FROM t CROSS JOIN LATERAL (
          SELECT e.id, e.task_id, e.stream, e.stream_id FROM outbox_event e WHERE e.task_id = t.id OFFSET 0) e),`
	if rows {
		a = `
a AS (DELETE FROM ingest_task_transition WHERE task_id IN (SELECT id FROM t)),`
		// The outbox log's rows (migration 00039) are read through
		// outbox_log_event, which shows their entry ids, before they go.
		o = `
r AS (DELETE FROM outbox_row WHERE task_id IN (SELECT id FROM t)
      RETURNING id, task_id, stream, stream_id),
l AS (SELECT e.id, e.task_id, e.stream, e.stream_id FROM t CROSS JOIN LATERAL (
          SELECT e.id, e.task_id, e.stream, e.stream_id FROM outbox_log_event e WHERE e.task_id = t.id OFFSET 0) e),
ld AS (DELETE FROM outbox_log WHERE task_id IN (SELECT id FROM t)),
o AS (SELECT * FROM r UNION ALL SELECT * FROM l),`
	}
	return `
t AS (DELETE FROM ingest_task WHERE id IN (SELECT id FROM pick) AND status IN ` + terminalSQL + `
      RETURNING id, status),` + a + o + `
d AS (SELECT t.id, t.status,
             coalesce(array_agg(o.stream ORDER BY o.id) FILTER (WHERE o.stream_id IS NOT NULL), '{}') AS streams,
             coalesce(array_agg(o.stream_id ORDER BY o.id) FILTER (WHERE o.stream_id IS NOT NULL), '{}') AS stream_ids
      FROM t LEFT JOIN o ON o.task_id = t.id
      GROUP BY t.id, t.status)`
}

// expiredSQL deletes up to $4 finished tasks whose state's window has
// passed since finished_at ($1 SUCCEEDED, $2 CANCELLED, $3 DEAD, in ms; -1
// keeps forever), oldest id first, and reads the stream entries their
// outbox rows had published. Their audit and outbox rows stay: both
// tables are partitioned by time, and the leader drops a whole partition
// once no row can land in it, moving the few rows of the tasks that still
// exist out first (package maintenance, partition.Retire), which costs a
// few WAL records where deleting the rows cost several per row. The
// outbox rows of a deleted task are read through outbox_event_task_idx
// in each partition. The candidates are
// read on the primary key below the UUIDv7 of now() minus the shortest
// window ($5 ms): a task finished before its cutoff was created before it,
// and a task's id is a UUIDv7 of its creation time. FOR UPDATE SKIP
// LOCKED: a task a worker or an operator holds is skipped (taken by a
// later pass), never waited on, and a worker waits on a picked row for one
// statement at most.
var expiredSQL = `
WITH pick AS (
    SELECT id FROM ingest_task
    WHERE id < ` + idAtSQL(nowMinusMSSQL("$5::bigint")) + `
      AND finished_at IS NOT NULL
      AND CASE status WHEN 'SUCCEEDED' THEN $1::bigint >= 0 AND finished_at < now() - $1::bigint * interval '1 millisecond'
                      WHEN 'CANCELLED' THEN $2::bigint >= 0 AND finished_at < now() - $2::bigint * interval '1 millisecond'
                      WHEN 'DEAD' THEN $3::bigint >= 0 AND finished_at < now() - $3::bigint * interval '1 millisecond'
                      ELSE false END
    ORDER BY id
    LIMIT $4
    FOR UPDATE SKIP LOCKED),` + finishedCTEs(false) + `
SELECT id, status, streams, stream_ids FROM d`

// DeleteExpired deletes up to limit finished tasks whose window (by state,
// from finished_at) has passed (their audit and outbox rows go with their
// partitions, see expiredSQL), in one statement, and returns
// those it deleted with the stream entries they had. Tasks locked by
// another transaction are skipped. Removing those entries from their
// streams (stream.Forget) and the DLQ entries of the DEAD ones
// (dlq.RemoveTasks) is the caller's, after the commit. With every window
// negative it deletes nothing.
func DeleteExpired(ctx context.Context, db DB, w Windows, limit int) ([]Deleted, error) {
	s, c, d := w.ms()
	least := int64(-1)
	for _, v := range []int64{s, c, d} {
		if v >= 0 && (least < 0 || v < least) {
			least = v
		}
	}
	if least < 0 || limit < 1 {
		return nil, nil
	}
	// RescuePlanSQL first, in the batch's implicit transaction: the
	// planner cannot tell how many ids lie below the cutoff (a bound
	// computed from now()) and, guessing a third of the table, would read
	// it and the audit and outbox tables whole; with those settings it
	// reads the primary key in id order, stopping after limit tasks, and
	// the audit and outbox rows by task.
	batch := &pgx.Batch{}
	batch.Queue(RescuePlanSQL)
	batch.Queue(expiredSQL, s, c, d, limit, least)
	br := db.SendBatch(ctx, batch)
	_, err := br.Exec()
	var out []Deleted
	if err == nil {
		out, err = collectDeleted(br.Query())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return out, fmt.Errorf("delete expired tasks: %w", err)
	}
	return out, nil
}

func collectDeleted(rows pgx.Rows, err error) ([]Deleted, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Deleted, error) {
		var d Deleted
		var streams, ids []string
		err := r.Scan(&d.ID, &d.Status, &streams, &ids)
		d.Entries = entryRefs(streams, ids)
		return d, err
	})
}
