package task_test

import (
	"testing"

	"github.com/ingest-worker/ingest/task"
)

// TestDeleteKindDeletesEveryRow: DeleteKind deletes a kind's tasks with
// their audit rows and their outbox rows, in outbox_row (a task with a
// group) and in the outbox log (one without), and leaves other kinds'.
func TestDeleteKindDeletesEveryRow(t *testing.T) {
	b := setup(t, task.Config{})
	b.create(t, task.NewTask{Kind: "throwaway"})
	b.create(t, task.NewTask{Kind: "throwaway", GroupKey: "g"})
	kept := b.create(t, task.NewTask{Kind: "kept"})
	rows := func() (tasks, audit, outboxRows, logRows int) {
		t.Helper()
		if err := b.db.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM ingest_task), (SELECT count(*) FROM ingest_task_transition),
			(SELECT count(*) FROM outbox_row), (SELECT count(*) FROM outbox_log)`).Scan(&tasks, &audit, &outboxRows, &logRows); err != nil {
			t.Fatal(err)
		}
		return tasks, audit, outboxRows, logRows
	}
	if tasks, _, outboxRows, logRows := rows(); tasks != 3 || outboxRows != 1 || logRows != 2 {
		t.Fatalf("before: %d tasks, %d outbox_row rows, %d log rows; want 3, 1 (the grouped task's) and 2", tasks, outboxRows, logRows)
	}
	if n, err := task.DeleteKind(b.ctx, b.db, "throwaway"); err != nil || n != 2 {
		t.Fatalf("DeleteKind = %d, %v; want 2", n, err)
	}
	if tasks, audit, outboxRows, logRows := rows(); tasks != 1 || audit != 1 || outboxRows != 0 || logRows != 1 {
		t.Fatalf("after: %d tasks, %d audit rows, %d outbox_row rows, %d log rows; want the kept task's 1, 1, 0 and 1", tasks, audit, outboxRows, logRows)
	}
	var id string
	if err := b.db.QueryRow(b.ctx, `SELECT task_id::text FROM outbox_event`).Scan(&id); err != nil || id != kept.ID.String() {
		t.Fatalf("the row left is %s's (%v), want the kept task's", id, err)
	}
}
