package transition_test

import (
	"testing"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/transition"
)

// TestInsertProbesTasksNeverAnalyzed checks that the audit insert checks
// that each record's task exists by a probe of ingest_task's primary key,
// not by a hash join over the whole table, on a database that was never
// analyzed (fresh, restored or truncated), both while ingest_task is
// empty (the planner then assumes ten pages, and a prepared statement
// keeps the plan it made as the table grows) and once it has grown.
func TestInsertProbesTasksNeverAnalyzed(t *testing.T) {
	db := testenv.NeverAnalyzed(t)
	check := func(state string) {
		t.Helper()
		nodes, plan := testenv.GenericPlan(t, db, transition.InsertSQL,
			`'{00000000-0000-7000-8000-000000000001}', '{""}', '{QUEUED}', '{0}', '{created}', '{""}'`)
		if bad := testenv.TableReads(nodes, "ingest_task"); len(bad) > 0 {
			t.Errorf("%s: the audit insert reads ingest_task by %v:\n%s", state, bad, plan)
		}
	}
	check("empty")
	testenv.GrowTasks(t, db, 10000)
	check("grown")
}
