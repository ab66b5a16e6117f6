package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// graphLimit bounds the tasks of the graph task show prints (the task
// included): beyond it the nearest ancestors and descendants.
const graphLimit = 100

// graphOf reads the dependency graph around task id for task show: its
// ancestors and descendants (not the task itself), each once.
func graphOf(ctx context.Context, db task.DB, id uuid.UUID) ([]task.GraphNode, bool, error) {
	g, err := task.ReadDependencyGraph(ctx, db, id, graphLimit)
	if err != nil {
		return nil, false, err
	}
	return g.Nodes[1:], g.Cut, nil
}

// printGraph prints the dependency graph of t as two indented trees: the
// tasks it depends on (and theirs), and the tasks that depend on it. Each
// task is printed once, under the task through which the graph reached it
// (GraphNode.Via).
func (a *app) printGraph(t task.Task, nodes []task.GraphNode, cut bool) {
	if len(nodes) == 0 && t.WaitingFor == 0 && t.WorkflowID == nil {
		return
	}
	a.printf("\nDEPENDENCIES (ingest_task_dependency)\n")
	if t.WorkflowID != nil {
		a.printf("  workflow %s\n", t.WorkflowID)
	}
	if t.WaitingFor > 0 {
		a.printf("  held: waiting for %d\n", t.WaitingFor)
	}
	under := map[uuid.UUID][]task.GraphNode{}
	for _, n := range nodes {
		under[n.Via] = append(under[n.Via], n)
	}
	var walk func(via uuid.UUID, depth int, ancestors bool)
	walk = func(via uuid.UUID, depth int, ancestors bool) {
		for _, n := range under[via] {
			if (n.Level < 0) == ancestors {
				a.printf("  %s%s\n", strings.Repeat("  ", depth), graphLine(n))
				walk(n.ID, depth+1, ancestors)
			}
		}
	}
	for _, part := range []struct {
		title     string
		ancestors bool
	}{{"depends on", true}, {"dependents", false}} {
		if !slices.ContainsFunc(nodes, func(n task.GraphNode) bool { return (n.Level < 0) == part.ancestors }) {
			continue
		}
		a.printf("  %s:\n", part.title)
		walk(t.ID, 1, part.ancestors)
	}
	if cut {
		a.printf("  (cut at %d tasks: the nearest are shown)\n", graphLimit)
	}
}

// graphLine is one task of the graph: id, kind, state, and what holds it.
func graphLine(n task.GraphNode) string {
	if !n.Exists {
		return fmt.Sprintf("- %s (deleted)", n.ID)
	}
	s := fmt.Sprintf("- %s %s %s", n.ID, n.Kind, n.Status)
	if n.WaitingFor > 0 && n.Status == task.Queued {
		s += fmt.Sprintf(" (waiting for %d)", n.WaitingFor)
	}
	if n.Reason != "dependency" {
		s += " [" + n.Reason + "]"
	}
	return s
}
