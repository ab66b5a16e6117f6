package task_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestReadDependencyGraph: a diamond (a; b and c after a; d after both)
// and a tail (e after d) read around d: every task once, each in its
// column (a two left of d, b and c one left, e one right), each reached
// through a neighbour one step closer to d, the four edges among the
// ancestors and the one to e; a graph past its limit keeps the nearest
// tasks and says it is cut; an unknown task is ErrNotFound.
func TestReadDependencyGraph(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "a", Payload: json.RawMessage(`{}`), Ref: "a"},
		{Kind: "b", Payload: json.RawMessage(`{}`), Ref: "b", DependsOnRefs: []string{"a"}},
		{Kind: "c", Payload: json.RawMessage(`{}`), Ref: "c", DependsOnRefs: []string{"a"}},
		{Kind: "d", Payload: json.RawMessage(`{}`), Ref: "d", DependsOnRefs: []string{"b", "c"}},
		{Kind: "e", Payload: json.RawMessage(`{}`), DependsOnRefs: []string{"d"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]uuid.UUID{}
	for _, r := range res {
		id[r.Task.Kind] = r.Task.ID
	}
	g, err := task.ReadDependencyGraph(b.ctx, b.db, id["d"], 100)
	if err != nil {
		t.Fatal(err)
	}
	if g.Cut || len(g.Nodes) != 5 || g.Nodes[0].ID != id["d"] || g.WaitingFor != 2 || g.OnDependencyFailure != "cancel" {
		t.Fatalf("graph around d: cut %v, %d nodes (first %s), waiting for %d, %q; want 5 nodes from d, waiting for 2",
			g.Cut, len(g.Nodes), g.Nodes[0].ID, g.WaitingFor, g.OnDependencyFailure)
	}
	wantLevel := map[string]int{"a": -2, "b": -1, "c": -1, "d": 0, "e": 1}
	byID := map[uuid.UUID]task.GraphNode{}
	for _, n := range g.Nodes {
		byID[n.ID] = n
	}
	for kind, l := range wantLevel {
		n, ok := byID[id[kind]]
		if !ok || !n.Exists || n.Kind != kind || n.Level != l {
			t.Fatalf("node %s: %+v (listed %v), want level %d", kind, n, ok, l)
		}
	}
	if via := byID[id["a"]].Via; via != id["b"] && via != id["c"] {
		t.Fatalf("a reached via %s, want b or c", via)
	}
	for kind, via := range map[string]string{"b": "d", "c": "d", "e": "d", "d": "d"} {
		if n := byID[id[kind]]; n.Via != id[via] || (kind != "d" && n.Reason != "dependency") {
			t.Fatalf("%s reached via %s (%q), want %s", kind, n.Via, n.Reason, via)
		}
	}
	if len(g.Edges) != 5 {
		t.Fatalf("%d edges, want 5: %+v", len(g.Edges), g.Edges)
	}

	// Past the limit: the nearest of a fan of 20 dependents.
	fan := make([]task.NewTask, 20)
	for i := range fan {
		fan[i] = task.NewTask{Kind: "leaf", Payload: json.RawMessage(fmt.Sprint(i)), DependsOn: []uuid.UUID{id["e"]}}
	}
	if _, err := b.store.CreateBatch(b.ctx, fan); err != nil {
		t.Fatal(err)
	}
	g, err = task.ReadDependencyGraph(b.ctx, b.db, id["e"], 10)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Cut || len(g.Nodes) != 10 {
		t.Fatalf("a graph of 26 tasks read with limit 10: cut %v, %d nodes", g.Cut, len(g.Nodes))
	}
	for _, n := range g.Nodes {
		if n.Level < -3 || n.Level > 1 {
			t.Fatalf("cut graph keeps %s at level %d, beyond the nearest", n.Kind, n.Level)
		}
	}
	if _, err := task.ReadDependencyGraph(b.ctx, b.db, uuid.New(), 10); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("an unknown task: %v, want ErrNotFound", err)
	}
}
