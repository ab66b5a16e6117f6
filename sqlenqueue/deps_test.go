package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/sqlenqueue"
	"github.com/ingest-worker/ingest/task"
)

// TestDependsOn: ingest_enqueue and ingest_enqueue_batch take depends_on
// (ids of existing tasks) and on_dependency_failure as the Go store does:
// the task is held (its outbox row not due) until its dependencies end,
// one that ended already applies at once, and an unknown id, a ref, a
// bad policy are refused naming the field, writing nothing; priority
// stays unknown.
func TestDependsOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	store := newStore(t, db, task.Config{})
	dep, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`1`)})
	if err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue('k', '{}', $1)`,
		fmt.Sprintf(`{"depends_on":[%q],"on_dependency_failure":"run"}`, dep.Task.ID)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	got, err := store.Get(ctx, id)
	if err != nil || got.WaitingFor != 1 || got.OnDependencyFailure != task.OnFailureRun || got.DependencyDepth != 1 ||
		got.WorkflowID == nil || *got.WorkflowID != dep.Task.ID {
		t.Fatalf("dependent from SQL: %+v, %v", got, err)
	}
	due := func(id uuid.UUID) int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND status = 'NEW' AND next_retry_at <= now()`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if due(id) != 0 {
		t.Fatal("a held task from SQL has a due outbox row")
	}
	if rs, err := store.Start(ctx, "w", time.Minute, dep.Task.ID); err != nil || rs[0].Outcome != task.Started {
		t.Fatal(rs, err)
	}
	if _, err := store.Fail(ctx, "w", task.Failure{ID: dep.Task.ID, Error: "x", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if got, _ := store.Get(ctx, id); got.WaitingFor != 0 || due(id) != 1 {
		t.Fatalf("run-anyway dependent after its dependency died: waiting %d, %d due rows", got.WaitingFor, due(id))
	}
	// A batch whose second task depends on the DEAD one: cancelled at once.
	var ids []uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue_batch($1)`,
		fmt.Sprintf(`[{"kind":"a","payload":1},{"kind":"b","payload":2,"depends_on":[%q]}]`, dep.Task.ID)).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if got, _ := store.Get(ctx, ids[1]); got.Status != task.Cancelled || !strings.Contains(got.CancelReason, dep.Task.ID.String()) {
		t.Fatalf("dependent of a DEAD task from SQL: %s %q", got.Status, got.CancelReason)
	}

	unknown := uuid.Must(uuid.NewV7())
	for _, c := range []struct{ name, sql, field, msg string }{
		{"unknown id", fmt.Sprintf(`SELECT ingest_enqueue('k', '{}', '{"depends_on":[%q]}')`, unknown), "depends_on", "depends_on: no task " + unknown.String() + " (unknown or deleted)"},
		{"batch unknown id", fmt.Sprintf(`SELECT ingest_enqueue_batch('[{"kind":"k","payload":1},{"kind":"k","payload":1,"depends_on":[%q]}]')`, unknown), "depends_on", "task 1: depends_on: no task " + unknown.String() + " (unknown or deleted)"},
		{"not an id", `SELECT ingest_enqueue('k', '{}', '{"depends_on":["parse"]}')`, "depends_on", `depends_on "parse" is not a task id`},
		{"not an array", `SELECT ingest_enqueue('k', '{}', '{"depends_on":"x"}')`, "depends_on", "depends_on must be a JSON array of task ids, got string"},
		{"ref", `SELECT ingest_enqueue_batch('[{"kind":"k","payload":1,"ref":"a"}]')`, "ref", "task 0: ref is not taken from SQL: depends_on names existing tasks by id"},
		{"policy", `SELECT ingest_enqueue('k', '{}', '{"on_dependency_failure":"skip"}')`, "on_dependency_failure", `on_dependency_failure must be "cancel" or "run", got "skip"`},
		{"priority", `SELECT ingest_enqueue('k', '{}', '{"priority":1}')`, "priority", `unknown field "priority"`},
	} {
		before := 0
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task`).Scan(&before); err != nil {
			t.Fatal(err)
		}
		_, err := db.Exec(ctx, c.sql)
		pg := pgError(t, err)
		if pg.Code != sqlenqueue.CodeInvalid || pg.Message != c.msg || pg.ColumnName != c.field {
			t.Errorf("%s: raised %s %q (column %q); want %q (column %q)", c.name, pg.Code, pg.Message, pg.ColumnName, c.msg, c.field)
		}
		after := 0
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task`).Scan(&after); err != nil || after != before {
			t.Errorf("%s: %d tasks written", c.name, after-before)
		}
	}
}
