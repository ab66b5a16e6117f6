package ui

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// GraphMax bounds the tasks of the dependency graph a task's page shows
// (the task, its ancestors and its descendants): beyond it the page shows
// the nearest ones and says the graph is cut.
const GraphMax = 200

// graphNode is one task of a dependency graph.
type graphNode struct {
	ID uuid.UUID
	// Exists is false for a dependency that was deleted (its edge
	// remains, released).
	Exists    bool
	Kind      string
	Status    task.State
	HasResult bool
	// WaitingFor is how many of its edges still hold it (0: free to run).
	WaitingFor int
	// Level is its place: < 0 an ancestor (-1 a direct dependency), 0 the
	// task of the page, > 0 a descendant (1 a direct dependent).
	Level int
	Self  bool
}

// Short is the end of the node's id (the start of a UUIDv7 is its
// creation time, shared by tasks created together).
func (n graphNode) Short() string { s := n.ID.String(); return "…" + s[len(s)-12:] }

// graphEdge is one dependency: To waits for From.
type graphEdge struct {
	From, To   graphNode
	Reason     string
	ReleasedAt *time.Time
}

// graphLevel is one column of the graph.
type graphLevel struct {
	Level int
	Nodes []graphNode
}

// Name says where the column stands from the task of the page.
func (l graphLevel) Name() string {
	switch {
	case l.Level == 0:
		return "this task"
	case l.Level == -1:
		return "dependencies"
	case l.Level == 1:
		return "dependents"
	case l.Level < 0:
		return fmt.Sprintf("%d levels up", -l.Level)
	default:
		return fmt.Sprintf("%d levels down", l.Level)
	}
}

// graphView is the pipeline part of a task's page: its workflow, its
// dependency settings and its graph of ancestors and descendants.
type graphView struct {
	WorkflowID *uuid.UUID
	// OnDependencyFailure is what a failed dependency does to the task:
	// "cancel" (the default) or "run".
	OnDependencyFailure string
	WaitingFor          int
	Levels              []graphLevel
	Edges               []graphEdge
	// Nodes counts the tasks shown; Cut says some were left out (GraphMax).
	Nodes int
	Cut   bool
}

// Shown tells whether the task is part of a pipeline at all: the page
// shows the section only then.
func (g *graphView) Shown() bool { return g.WorkflowID != nil || len(g.Edges) > 0 || g.Nodes > 1 }

// dependencyGraph reads the pipeline part of task id's page: at most
// GraphMax tasks, the nearest ancestors and descendants first
// (task.ReadDependencyGraph), by column.
func dependencyGraph(ctx context.Context, db task.DB, id uuid.UUID) (*graphView, error) {
	dg, err := task.ReadDependencyGraph(ctx, db, id, GraphMax)
	if err != nil {
		return nil, err
	}
	g := &graphView{WorkflowID: dg.WorkflowID, OnDependencyFailure: dg.OnDependencyFailure,
		WaitingFor: dg.WaitingFor, Nodes: len(dg.Nodes), Cut: dg.Cut}
	nodes := make(map[uuid.UUID]graphNode, len(dg.Nodes))
	byLevel := map[int][]graphNode{}
	for _, n := range dg.Nodes {
		v := graphNode{ID: n.ID, Exists: n.Exists, Kind: n.Kind, Status: n.Status, HasResult: n.HasResult,
			WaitingFor: n.WaitingFor, Level: n.Level, Self: n.ID == id}
		nodes[n.ID] = v
		byLevel[n.Level] = append(byLevel[n.Level], v)
	}
	for l, ns := range byLevel {
		g.Levels = append(g.Levels, graphLevel{Level: l, Nodes: ns})
	}
	sort.Slice(g.Levels, func(i, j int) bool { return g.Levels[i].Level < g.Levels[j].Level })
	for _, e := range dg.Edges {
		g.Edges = append(g.Edges, graphEdge{From: nodes[e.From], To: nodes[e.To], Reason: e.Reason, ReleasedAt: e.ReleasedAt})
	}
	sort.SliceStable(g.Edges, func(i, j int) bool {
		a, b := g.Edges[i], g.Edges[j]
		if a.To.Level != b.To.Level {
			return a.To.Level < b.To.Level
		}
		return a.From.Level < b.From.Level
	})
	return g, nil
}
