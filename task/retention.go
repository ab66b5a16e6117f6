package task

import (
	"context"
	"fmt"
	"time"
)

// deleteSentSQL deletes up to $2 SENT outbox rows sent more than $1 ms
// ago, oldest first, except the latest row of an unfinished task: the
// rescuer needs that row's stream_id to tell whether the task's entry is
// still in Redis. The rows are read in creation order, on
// outbox_event_created_idx: a row sent before the cutoff was created
// before it.
var deleteSentSQL = `
DELETE FROM outbox_event WHERE id = ANY(ARRAY(
    SELECT o.id FROM outbox_event o
    WHERE o.created_at < now() - $1 * interval '1 millisecond'
      AND o.status = 'SENT' AND o.sent_at < now() - $1 * interval '1 millisecond'
      AND ((SELECT t.status FROM ingest_task t WHERE t.id = o.task_id) IN ` + terminalSQL + `
           OR EXISTS (SELECT 1 FROM outbox_event n WHERE n.task_id = o.task_id AND n.id > o.id))
    ORDER BY o.created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED))`

// DeleteSentOutbox deletes up to limit SENT outbox rows sent more than age
// ago, oldest first, in one statement, and returns how many it deleted. The
// latest row of a task that is not finished is kept (the rescuer reads its
// stream_id), and so are DEAD rows (forensics).
func DeleteSentOutbox(ctx context.Context, db DB, age time.Duration, limit int) (int, error) {
	tag, err := db.Exec(ctx, deleteSentSQL, age.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("delete sent outbox rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// deleteKindSQL deletes every task of kind $1 with its audit and outbox
// rows (no foreign key cascades them: package task writes them with the
// task and deletes them with it).
const deleteKindSQL = `
WITH t AS (DELETE FROM ingest_task WHERE kind = $1 RETURNING id),
a AS (DELETE FROM ingest_task_transition WHERE task_id IN (SELECT id FROM t)),
o AS (DELETE FROM outbox_event WHERE task_id IN (SELECT id FROM t))
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
