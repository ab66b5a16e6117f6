package task

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// DependencyGraph is the dependency graph around one task: its ancestors
// (the tasks it depends on, theirs, ...), its descendants, and the edges
// among them. The dashboard's task page draws it; task show prints it.
type DependencyGraph struct {
	// Task is the task at its center; WorkflowID, OnDependencyFailure and
	// WaitingFor are that task's.
	Task                uuid.UUID
	WorkflowID          *uuid.UUID
	OnDependencyFailure string
	WaitingFor          int
	// Nodes are the task (first), then its ancestors, then its
	// descendants, each side nearest first; each task once.
	Nodes []GraphNode
	// Edges are the dependencies among Nodes: To waits for From.
	Edges []GraphEdge
	// Cut says the graph had more tasks than the limit it was read with:
	// the nearest were kept.
	Cut bool
}

// GraphNode is one task of a DependencyGraph.
type GraphNode struct {
	ID uuid.UUID `json:"id"`
	// Exists is false for a dependency that was deleted (its edge
	// remains, released): it has no kind and no status.
	Exists     bool   `json:"exists"`
	Kind       string `json:"kind"`
	Status     State  `json:"status"`
	HasResult  bool   `json:"has_result"`
	WaitingFor int    `json:"waiting_for,omitempty"`
	// Level is its column: < 0 an ancestor (-1 a direct dependency), 0
	// the center, > 0 a descendant (1 a direct dependent). A descendant
	// stands one right of its furthest parent on its side, an ancestor
	// one left of its furthest child, so every edge points right.
	Level int `json:"level"`
	// Via is the task one step closer to the center through which the
	// walk reached this one (the center's own: its id), and Reason that
	// edge's reason: "dependency" or "sequence".
	Via    uuid.UUID `json:"via"`
	Reason string    `json:"reason,omitempty"`
}

// GraphEdge is one dependency of a DependencyGraph: To waits for From.
type GraphEdge struct {
	From, To   uuid.UUID
	Reason     string
	ReleasedAt *time.Time
}

// The graph's statements. Each walk follows the edges breadth first; UNION
// drops a task reached again (a diamond), and the LIMIT stops the walk
// (PostgreSQL evaluates a recursive query only as far as it is read).
const (
	graphAncestorsSQL = `
WITH RECURSIVE up(id) AS (
    SELECT depends_on FROM ingest_task_dependency WHERE task_id = $1
    UNION
    SELECT d.depends_on FROM up JOIN ingest_task_dependency d ON d.task_id = up.id
)
SELECT id FROM up LIMIT $2`
	graphDescendantsSQL = `
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

// ReadDependencyGraph reads the dependency graph around task id, at most
// limit tasks (the task included; limit >= 3), in one read-only snapshot
// of four bounded statements, each reading by key. Past the limit it
// keeps the nearest ancestors and descendants, each side at least half
// of the room when both have more. A task that does not exist is
// ErrNotFound.
func ReadDependencyGraph(ctx context.Context, db DB, id uuid.UUID, limit int) (*DependencyGraph, error) {
	if limit < 3 {
		return nil, fmt.Errorf("read the dependency graph: limit %d is below 3", limit)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err != nil {
		return nil, err
	}
	// The walks probe the edges by their primary key and depends_on
	// index, the tasks by id: the hot statements' planner settings keep
	// it so whatever the statistics say, for this transaction only.
	if _, err := tx.Exec(ctx, pgplan.Settings); err != nil {
		return nil, err
	}
	g, err := readGraph(ctx, tx, id, limit)
	if err != nil {
		return nil, err
	}
	return g, tx.Commit(ctx)
}

func readGraph(ctx context.Context, tx pgx.Tx, id uuid.UUID, limit int) (*DependencyGraph, error) {
	walk := func(sql string) ([]uuid.UUID, error) {
		rows, err := tx.Query(ctx, sql, id, limit)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	}
	up, err := walk(graphAncestorsSQL)
	if err != nil {
		return nil, fmt.Errorf("dependency graph of %s: ancestors: %w", id, err)
	}
	down, err := walk(graphDescendantsSQL)
	if err != nil {
		return nil, fmt.Errorf("dependency graph of %s: descendants: %w", id, err)
	}
	g := &DependencyGraph{Task: id}
	up, down, g.Cut = cutGraph(up, down, limit-1)
	ids := append(append([]uuid.UUID{id}, up...), down...)
	side := make(map[uuid.UUID]int, len(ids)) // -1 ancestor, 1 descendant, 0 the task
	for _, u := range up {
		side[u] = -1
	}
	for _, d := range down {
		side[d] = 1
	}
	nodes := make(map[uuid.UUID]*GraphNode, len(ids))
	for _, x := range ids {
		nodes[x] = &GraphNode{ID: x}
	}
	if err := readGraphNodes(ctx, tx, g, ids, nodes); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, graphEdgesSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("dependency graph of %s: edges: %w", id, err)
	}
	g.Edges, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (GraphEdge, error) {
		var e GraphEdge
		err := r.Scan(&e.From, &e.To, &e.Reason, &e.ReleasedAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("dependency graph of %s: edges: %w", id, err)
	}
	placeGraph(id, side, g.Edges, nodes)
	for _, x := range ids {
		g.Nodes = append(g.Nodes, *nodes[x])
	}
	return g, nil
}

// cutGraph keeps at most room of the ancestors up and the descendants
// down (each nearest first), each side at least half of the room when
// both have more.
func cutGraph(up, down []uuid.UUID, room int) ([]uuid.UUID, []uuid.UUID, bool) {
	if len(up)+len(down) <= room {
		return up, down, false
	}
	half := room / 2
	switch {
	case len(up) <= half:
		down = down[:room-len(up)]
	case len(down) <= room-half:
		up = up[:room-len(down)]
	default:
		up, down = up[:half], down[:room-half]
	}
	return up, down, true
}

func readGraphNodes(ctx context.Context, tx pgx.Tx, g *DependencyGraph, ids []uuid.UUID, nodes map[uuid.UUID]*GraphNode) error {
	rows, err := tx.Query(ctx, graphNodesSQL, ids)
	if err != nil {
		return fmt.Errorf("dependency graph of %s: tasks: %w", g.Task, err)
	}
	defer rows.Close()
	for rows.Next() {
		var x uuid.UUID
		var onFail string
		var wf *uuid.UUID
		var n GraphNode
		if err := rows.Scan(&x, &n.Kind, &n.Status, &n.HasResult, &n.WaitingFor, &wf, &onFail); err != nil {
			return fmt.Errorf("dependency graph of %s: tasks: %w", g.Task, err)
		}
		n.ID, n.Exists = x, true
		*nodes[x] = n
		if x == g.Task {
			g.WorkflowID, g.OnDependencyFailure, g.WaitingFor = wf, onFail, n.WaitingFor
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("dependency graph of %s: tasks: %w", g.Task, err)
	}
	if !nodes[g.Task].Exists {
		return ErrNotFound
	}
	return nil
}

// placeGraph sets each node's Level (its column, see GraphNode) and its
// Via and Reason: the edge through which a breadth-first walk from the
// center, on the node's own side, first reached it. A cycle (which
// creation refuses) would not loop: a task met again on the path counts
// as placed.
func placeGraph(self uuid.UUID, side map[uuid.UUID]int, edges []GraphEdge, nodes map[uuid.UUID]*GraphNode) {
	parents := map[uuid.UUID][]GraphEdge{}
	children := map[uuid.UUID][]GraphEdge{}
	for _, e := range edges {
		parents[e.To] = append(parents[e.To], e)
		children[e.From] = append(children[e.From], e)
	}
	onSide := func(x uuid.UUID, s int) bool { return x == self || side[x] == s }

	level := map[uuid.UUID]int{self: 0}
	onPath := map[uuid.UUID]bool{}
	// place returns x's column on side s: one beyond the furthest of its
	// neighbours toward the center (its parents for a descendant, its
	// children for an ancestor).
	var place func(x uuid.UUID, s int) int
	place = func(x uuid.UUID, s int) int {
		if l, ok := level[x]; ok {
			return l
		}
		if onPath[x] {
			return s
		}
		onPath[x] = true
		toward := parents[x]
		if s < 0 {
			toward = children[x]
		}
		l := s
		for _, e := range toward {
			n := e.From
			if s < 0 {
				n = e.To
			}
			if onSide(n, s) {
				if c := place(n, s) + s; c*s > l*s {
					l = c
				}
			}
		}
		delete(onPath, x)
		level[x] = l
		return l
	}
	for x, s := range side {
		place(x, s)
	}
	for x, n := range nodes {
		n.Level = level[x]
	}

	// Via: breadth first from the center, each side along its own edges.
	nodes[self].Via = self
	for _, s := range []int{-1, 1} {
		seen := map[uuid.UUID]bool{self: true}
		queue := []uuid.UUID{self}
		for len(queue) > 0 {
			x := queue[0]
			queue = queue[1:]
			away := children[x]
			if s < 0 {
				away = parents[x]
			}
			for _, e := range away {
				n := e.To
				if s < 0 {
					n = e.From
				}
				if seen[n] || side[n] != s {
					continue
				}
				seen[n] = true
				nodes[n].Via, nodes[n].Reason = x, e.Reason
				queue = append(queue, n)
			}
		}
	}
}
