package testenv

import (
	"context"
	"encoding/json"
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
	ctx := context.Background()
	conn, err := db.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		tb.Fatal(err)
	}
	defer conn.Exec(ctx, `RESET plan_cache_mode`)
	if _, err := conn.Exec(ctx, `PREPARE generic_plan AS `+sql); err != nil {
		tb.Fatal(err)
	}
	defer conn.Exec(ctx, `DEALLOCATE generic_plan`)
	var plan []byte
	if err := conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE generic_plan(`+args+`)`).Scan(&plan); err != nil {
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
