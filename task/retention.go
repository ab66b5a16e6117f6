package task

import (
	"context"
	"fmt"
	"time"
)

// deleteSentSQL deletes up to $2 SENT outbox rows sent more than $1 ms
// ago, oldest first, except the latest row of an unfinished task: the
// rescuer needs that row's stream_id to tell whether the task's entry is
// still in Redis.
var deleteSentSQL = `
DELETE FROM outbox_event WHERE id = ANY(ARRAY(
    SELECT o.id FROM outbox_event o
    WHERE o.status = 'SENT' AND o.sent_at < now() - $1 * interval '1 millisecond'
      AND ((SELECT t.status FROM ingest_task t WHERE t.id = o.task_id) IN ` + terminalSQL + `
           OR EXISTS (SELECT 1 FROM outbox_event n WHERE n.task_id = o.task_id AND n.id > o.id))
    ORDER BY o.sent_at
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
