package task

import (
	"context"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/internal/pgplan"
	"github.com/ingest-worker/ingest/internal/testenv"
)

// TestGraphStatementsReadByKey checks the plans of the dependency graph's
// statements on tables analyzed while nearly empty and then filled (the
// planner's worst guess): each reaches ingest_task_dependency through its
// primary key (task_id first) or its depends_on index, and ingest_task
// through its primary key, so a dependency graph costs the same on a
// table of millions.
func TestGraphStatementsReadByKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	exec := func(q string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%v: %s", err, q)
		}
	}
	exec(`ANALYZE ingest_task; ANALYZE ingest_task_dependency`)
	exec(`INSERT INTO ingest_task (id, kind, payload, payload_sha)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'plan', '{}', md5(g::text) FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO ingest_task_dependency (task_id, depends_on)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, ('00000000-0000-7000-8000-' || lpad(to_hex(g - 1), 12, '0'))::uuid
		FROM generate_series(2, 20000) g`)
	const one, some = `'00000000-0000-7000-8000-000000000100', 200`, `ARRAY['00000000-0000-7000-8000-000000000100'::uuid, '00000000-0000-7000-8000-000000000101']`
	for name, st := range map[string][2]string{
		"ancestors": {graphAncestorsSQL, one}, "descendants": {graphDescendantsSQL, one},
		"tasks": {graphNodesSQL, some}, "edges": {graphEdgesSQL, some},
	} {
		nodes, plan := testenv.GenericPlanWith(t, db.Pool, pgplan.Settings, st[0], st[1])
		for _, p := range nodes {
			switch {
			case p.Relation != "ingest_task" && p.Relation != "ingest_task_dependency":
			case p.NodeType == "Bitmap Heap Scan": // its Bitmap Index Scan names the index
			case strings.Contains(p.NodeType, "Seq Scan"):
				t.Errorf("%s scans %s sequentially:\n%s", name, p.Relation, plan)
			case p.Relation == "ingest_task" && p.Index != "ingest_task_pkey":
				t.Errorf("%s reads ingest_task through %q, not its primary key:\n%s", name, p.Index, plan)
			case p.Relation == "ingest_task_dependency" && p.Index != "ingest_task_dependency_pkey" && p.Index != "ingest_task_dependency_depends_on_idx":
				t.Errorf("%s reads ingest_task_dependency through %q:\n%s", name, p.Index, plan)
			}
		}
	}
}
