package ui

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
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

// The graph's queries. Each walk follows the edges breadth first; UNION
// drops a task reached again (a diamond), and the LIMIT stops the walk
// (PostgreSQL evaluates a recursive query only as far as it is read).
const (
	ancestorsSQL = `
WITH RECURSIVE up(id) AS (
    SELECT depends_on FROM ingest_task_dependency WHERE task_id = $1
    UNION
    SELECT d.depends_on FROM up JOIN ingest_task_dependency d ON d.task_id = up.id
)
SELECT id FROM up LIMIT $2`
	descendantsSQL = `
WITH RECURSIVE down(id) AS (
    SELECT task_id FROM ingest_task_dependency WHERE depends_on = $1
    UNION
    SELECT d.task_id FROM down JOIN ingest_task_dependency d ON d.depends_on = down.id
)
SELECT id FROM down LIMIT $2`
	graphNodesSQL = `
SELECT id, kind, status, result IS NOT NULL, coalesce(waiting_for, 0), workflow_id, coalesce(on_dependency_failure, 'cancel')
FROM ingest_task WHERE id = ANY($1)`
	graphEdgesSQL = `
SELECT depends_on, task_id, reason, released_at FROM ingest_task_dependency
WHERE task_id = ANY($1) AND depends_on = ANY($1)`
)

// dependencyGraph reads the pipeline part of task id's page, in one
// read-only snapshot: at most GraphMax tasks (the nearest ancestors and
// descendants first), four bounded statements.
func dependencyGraph(ctx context.Context, db task.DB, id uuid.UUID) (*graphView, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err != nil {
		return nil, err
	}
	// Each statement reads by key (the walks probe the edges by their
	// primary key and depends_on index, the tasks by id): the planner
	// settings of the hot statements keep it so whatever the statistics
	// say (pgplan), for this transaction only.
	if _, err := tx.Exec(ctx, pgplan.Settings); err != nil {
		return nil, err
	}
	walk := func(sql string) ([]uuid.UUID, error) {
		rows, err := tx.Query(ctx, sql, id, GraphMax)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	}
	up, err := walk(ancestorsSQL)
	if err != nil {
		return nil, fmt.Errorf("dependency graph: ancestors: %w", err)
	}
	down, err := walk(descendantsSQL)
	if err != nil {
		return nil, fmt.Errorf("dependency graph: descendants: %w", err)
	}
	g := &graphView{}
	// Both walks read at most GraphMax; keep GraphMax-1 beside the task,
	// each side at least half of them when both have more (the walks
	// return the nearest first).
	room := GraphMax - 1
	if len(up)+len(down) > room {
		g.Cut = true
		half := room / 2
		switch {
		case len(up) <= half:
			down = down[:room-len(up)]
		case len(down) <= room-half:
			up = up[:room-len(down)]
		default:
			up, down = up[:half], down[:room-half]
		}
	}
	ids := append(append([]uuid.UUID{id}, up...), down...)
	nodes := make(map[uuid.UUID]*graphNode, len(ids))
	side := make(map[uuid.UUID]int, len(ids)) // -1 ancestor, 1 descendant, 0 the task
	for _, u := range up {
		side[u] = -1
	}
	for _, d := range down {
		side[d] = 1
	}
	for _, x := range ids {
		nodes[x] = &graphNode{ID: x, Self: x == id}
	}
	rows, err := tx.Query(ctx, graphNodesSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("dependency graph: tasks: %w", err)
	}
	for rows.Next() {
		var x uuid.UUID
		var kind, onFail string
		var status task.State
		var hasResult bool
		var waiting int
		var wf *uuid.UUID
		if err := rows.Scan(&x, &kind, &status, &hasResult, &waiting, &wf, &onFail); err != nil {
			rows.Close()
			return nil, fmt.Errorf("dependency graph: tasks: %w", err)
		}
		n := nodes[x]
		n.Exists, n.Kind, n.Status, n.HasResult, n.WaitingFor = true, kind, status, hasResult, waiting
		if x == id {
			g.WorkflowID, g.OnDependencyFailure, g.WaitingFor = wf, onFail, waiting
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("dependency graph: tasks: %w", err)
	}
	if !nodes[id].Exists {
		return nil, task.ErrNotFound
	}
	type edge struct {
		from, to uuid.UUID
		reason   string
		released *time.Time
	}
	rows, err = tx.Query(ctx, graphEdgesSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("dependency graph: edges: %w", err)
	}
	edges, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (edge, error) {
		var e edge
		err := r.Scan(&e.from, &e.to, &e.reason, &e.released)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("dependency graph: edges: %w", err)
	}
	// An edge between an ancestor and a descendant (possible only through
	// the task itself) cannot exist; an edge within a side places its ends.
	parents := map[uuid.UUID][]uuid.UUID{}
	children := map[uuid.UUID][]uuid.UUID{}
	for _, e := range edges {
		parents[e.to] = append(parents[e.to], e.from)
		children[e.from] = append(children[e.from], e.to)
	}
	levelOf := layers(id, side, parents, children)
	for x, n := range nodes {
		n.Level = levelOf[x]
	}
	byLevel := map[int][]graphNode{}
	for _, x := range ids {
		n := *nodes[x]
		byLevel[n.Level] = append(byLevel[n.Level], n)
	}
	for l, ns := range byLevel {
		g.Levels = append(g.Levels, graphLevel{Level: l, Nodes: ns})
	}
	sort.Slice(g.Levels, func(i, j int) bool { return g.Levels[i].Level < g.Levels[j].Level })
	for _, e := range edges {
		g.Edges = append(g.Edges, graphEdge{From: *nodes[e.from], To: *nodes[e.to], Reason: e.reason, ReleasedAt: e.released})
	}
	sort.SliceStable(g.Edges, func(i, j int) bool {
		a, b := g.Edges[i], g.Edges[j]
		if a.To.Level != b.To.Level {
			return a.To.Level < b.To.Level
		}
		return a.From.Level < b.From.Level
	})
	g.Nodes = len(ids)
	return g, tx.Commit(ctx)
}

// layers places each task of the graph in a column: a descendant one
// further than its furthest parent among the task and the descendants
// (so a task stands right of everything it waits for), an ancestor one
// before its furthest child among the task and the ancestors (so it
// stands left of everything that waits for it). A cycle
// (which creation refuses) would not loop: a task met again on the path
// counts as placed.
func layers(self uuid.UUID, side map[uuid.UUID]int, parents, children map[uuid.UUID][]uuid.UUID) map[uuid.UUID]int {
	level := map[uuid.UUID]int{self: 0}
	onPath := map[uuid.UUID]bool{}
	var down func(x uuid.UUID) int
	down = func(x uuid.UUID) int {
		if l, ok := level[x]; ok {
			return l
		}
		if onPath[x] {
			return 1
		}
		onPath[x] = true
		l := 1
		for _, p := range parents[x] {
			if p == self || side[p] == 1 {
				l = max(l, down(p)+1)
			}
		}
		delete(onPath, x)
		level[x] = l
		return l
	}
	var up func(x uuid.UUID) int
	up = func(x uuid.UUID) int {
		if l, ok := level[x]; ok {
			return l
		}
		if onPath[x] {
			return -1
		}
		onPath[x] = true
		l := 0
		for _, c := range children[x] {
			if c == self || side[c] == -1 {
				l = min(l, up(c)-1)
			}
		}
		if l == 0 {
			l = -1
		}
		delete(onPath, x)
		level[x] = l
		return l
	}
	for x, s := range side {
		if s == 1 {
			down(x)
		} else if s == -1 {
			up(x)
		}
	}
	return level
}
