package testenv

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PlanNode is one node of an EXPLAIN (FORMAT JSON) plan.
type PlanNode struct {
	NodeType string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Plans    []PlanNode `json:"Plans"`
}

// GenericPlan returns the nodes of the generic plan of sql (the plan a
// prepared statement settles on after a few executions), flattened, and
// the plan as JSON. args are its arguments as SQL literals, joined by
// commas. The statement is only planned, never run.
func GenericPlan(tb testing.TB, db *pgxpool.Pool, sql, args string) ([]PlanNode, string) {
	tb.Helper()
	return GenericPlanWith(tb, db, "", sql, args)
}

// GenericPlanWith is GenericPlan with the statement settings (a
// statement such as a SELECT of set_config(..., true), or "") run first
// in the same transaction, as the code sends them.
func GenericPlanWith(tb testing.TB, db *pgxpool.Pool, settings, sql, args string) ([]PlanNode, string) {
	tb.Helper()
	ctx := context.Background()
	conn, err := db.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() {
		_ = tx.Rollback(ctx)
		// A prepared statement outlives its transaction.
		_, _ = conn.Exec(ctx, `DEALLOCATE generic_plan`)
	}()
	for _, q := range []string{settings, `SET LOCAL plan_cache_mode = force_generic_plan`, `PREPARE generic_plan AS ` + sql} {
		if q == "" {
			continue
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			tb.Fatalf("%v: %s", err, q)
		}
	}
	if args != "" {
		args = "(" + args + ")"
	}
	var plan []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE generic_plan`+args).Scan(&plan); err != nil {
		tb.Fatal(err)
	}
	return ParsePlan(tb, plan), string(plan)
}

// ParsePlan returns the nodes of an EXPLAIN (FORMAT JSON) plan, flattened.
func ParsePlan(tb testing.TB, plan []byte) []PlanNode {
	tb.Helper()
	var root []struct{ Plan PlanNode }
	if err := json.Unmarshal(plan, &root); err != nil || len(root) != 1 {
		tb.Fatalf("EXPLAIN output %s: %v", plan, err)
	}
	var nodes []PlanNode
	var walk func(PlanNode)
	walk = func(p PlanNode) {
		nodes = append(nodes, p)
		for _, c := range p.Plans {
			walk(c)
		}
	}
	walk(root[0].Plan)
	return nodes
}

// TableReads returns why plan (flattened by ParsePlan) reads one of
// tables other than by probes of an index: a sequential scan of it, or a
// hash or merge join over it (which reads the joined table whole, however
// few rows it needs). Nothing: every read of those tables is an index
// scan, each bounded by its condition.
// A partition counts as its table (Table).
func TableReads(nodes []PlanNode, tables ...string) []string {
	guarded := map[string]bool{}
	for _, t := range tables {
		guarded[t] = true
	}
	// reads: p's subtree scans a guarded table other than as the inner
	// side of a nested loop (a probe per outer row).
	var reads func(PlanNode) bool
	reads = func(p PlanNode) bool {
		if guarded[Table(p.Relation)] && strings.Contains(p.NodeType, "Scan") {
			return true
		}
		if p.NodeType == "Nested Loop" {
			return len(p.Plans) > 0 && reads(p.Plans[0])
		}
		for _, c := range p.Plans {
			if reads(c) {
				return true
			}
		}
		return false
	}
	var bad []string
	for _, p := range nodes {
		switch {
		case guarded[Table(p.Relation)] && strings.Contains(p.NodeType, "Seq Scan"):
			bad = append(bad, p.NodeType+" on "+p.Relation)
		case (p.NodeType == "Hash Join" || p.NodeType == "Merge Join") && reads(p):
			bad = append(bad, p.NodeType+" over "+strings.Join(tables, "/"))
		}
	}
	return bad
}

// NeverAnalyzed returns a new migrated database none of whose tables has
// ever been analyzed (as after a fresh migration, a restore or a
// TRUNCATE), with autovacuum off on its tables for the rest of the test,
// so that nothing analyzes them while it runs. It fails the test if a
// table has statistics.
func NeverAnalyzed(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	db := DB(tb)
	rows, err := db.Query(ctx, `SELECT c.relname, c.reltuples, EXISTS (SELECT 1 FROM pg_statistic s WHERE s.starelid = c.oid)
		FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' ORDER BY c.relname`)
	if err != nil {
		tb.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		var tuples float64
		var stats bool
		if err := rows.Scan(&name, &tuples, &stats); err != nil {
			tb.Fatal(err)
		}
		if tuples >= 0 || stats {
			tb.Fatalf("table %s of a new database has statistics (reltuples %v, pg_statistic rows: %v): the template was analyzed", name, tuples, stats)
		}
		tables = append(tables, name)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	for _, t := range tables {
		if _, err := db.Exec(ctx, `ALTER TABLE `+t+` SET (autovacuum_enabled = off)`); err != nil {
			tb.Fatal(err)
		}
	}
	return db
}

// GrowTasks adds n tasks to db without analyzing any table: one in ten
// QUEUED, the others RUNNING, each with its creation audit row and a
// SENT outbox row, and a NEW outbox row for the QUEUED ones.
func GrowTasks(tb testing.TB, db *pgxpool.Pool, n int) {
	tb.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, status, lease_owner, lease_until)
		 SELECT gen_random_uuid(), 'plan', jsonb_build_object('n', g, 'pad', repeat('x', 200)), md5(g::text), 3,
		        CASE WHEN g % 10 = 0 THEN 'QUEUED' ELSE 'RUNNING' END,
		        CASE WHEN g % 10 = 0 THEN NULL ELSE 'w' END, CASE WHEN g % 10 = 0 THEN NULL ELSE now() + interval '1 hour' END
		 FROM generate_series(1, $1::int) g`,
		`INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count) SELECT id, NULL, 'QUEUED', 0 FROM ingest_task`,
		`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at) SELECT id, 's', 'SENT', '1-1', now() FROM ingest_task`,
		`INSERT INTO outbox_event (task_id, stream) SELECT id, 's' FROM ingest_task WHERE status = 'QUEUED'`,
	} {
		var err error
		if strings.Contains(q, "$1") {
			_, err = db.Exec(ctx, q, n)
		} else {
			_, err = db.Exec(ctx, q)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// CheckIndexPaths fails the test for every statement of stmts whose
// generic plan, planned under its settings, reads one of tables other
// than by index probes (TableReads). Each statement is {settings, sql,
// args}; state names the database's state in the messages.
func CheckIndexPaths(t *testing.T, db *pgxpool.Pool, state string, stmts map[string][3]string, tables ...string) {
	t.Helper()
	for name, st := range stmts {
		nodes, plan := GenericPlanWith(t, db, st[0], st[1], st[2])
		if bad := TableReads(nodes, tables...); len(bad) > 0 {
			t.Errorf("%s, %s: %v:\n%s", state, name, bad, plan)
		}
	}
}

// Table is the table a plan's relation belongs to: for a partition of a
// table partitioned by time, which plans name by the partition
// (outbox_event_history, outbox_event_from_1, ingest_task_transition_default,
// ...), the partitioned table; else the relation itself.
func Table(relation string) string {
	for _, t := range []string{"outbox_event", "ingest_task_transition"} {
		if strings.HasPrefix(relation, t+"_") {
			return t
		}
	}
	return relation
}
