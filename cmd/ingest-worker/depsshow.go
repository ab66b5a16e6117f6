package main

import (
	"fmt"
	"strings"

	"github.com/ingest-worker/ingest/task"
)

// graphLimit bounds the ancestors and the descendants task show lists.
const graphLimit = 50

// printGraph prints the dependency graph of t as two indented trees: the
// tasks it depends on (and theirs), and the tasks that depend on it.
func (a *app) printGraph(t task.Task, nodes []task.GraphNode) {
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
	var up, down int
	for _, n := range nodes {
		if n.Level < 0 {
			up++
		} else {
			down++
		}
	}
	for _, part := range []struct {
		title string
		n     int
		want  func(level int) bool
	}{
		{"depends on", up, func(l int) bool { return l < 0 }},
		{"dependents", down, func(l int) bool { return l > 0 }},
	} {
		if part.n == 0 {
			continue
		}
		more := ""
		if part.n >= graphLimit {
			more = fmt.Sprintf(" (the first %d)", graphLimit)
		}
		a.printf("  %s%s:\n", part.title, more)
		for _, n := range nodes {
			if !part.want(n.Level) {
				continue
			}
			a.printf("  %s%s\n", strings.Repeat("  ", abs(n.Level)), graphLine(n))
		}
	}
}

// graphLine is one task of the graph: id, kind, state, and what holds it.
func graphLine(n task.GraphNode) string {
	if n.Status == "" {
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

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
