package task

// This file owns dependencies between tasks (migration 00018,
// docs/PIPELINES.md "Dependencies"): creating the edges of a new task
// (linkDependencies, with the checks of NewTask.DependsOn, DependsOnRefs
// and Ref), and reading a task's dependencies and dependents. Releasing a
// dependent when its dependencies end is the database's: the triggers of
// migration 00018 (ingest_task_end_edges) run in the transaction of every
// end of a task, whichever statement writes it.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/seal"
)

// The policies of NewTask.OnDependencyFailure.
const (
	// OnFailureCancel: a dependency that ends DEAD or CANCELLED cancels the
	// task (audited; the message names the dependency). The default.
	OnFailureCancel = "cancel"
	// OnFailureRun: the task runs once every dependency has ended,
	// whatever their ends (a batch's completion callback).
	OnFailureRun = "run"
)

// Limits of a task's dependencies.
const (
	// MaxDependencies is the most dependencies (DependsOn and
	// DependsOnRefs together) one task may have: the fan-in limit.
	MaxDependencies = 1000
	// MaxDependencyDepth is the longest chain of dependencies above a task
	// (a task without dependencies has depth 0, its dependents 1, ...).
	// A dependency's end cancels its dependents in the same transaction,
	// one nested statement per level, so the depth is bounded.
	MaxDependencyDepth = 100
	// MaxRefLength is the longest Ref (and entry of DependsOnRefs).
	MaxRefLength = 200
)

// HeldUntil is the due time of a held task's outbox row: never, until
// its release replaces the row with one due at once.
var HeldUntil = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// DependencyCancelledBy is the cancel_requested_by of a task cancelled by
// the end of one of its dependencies, and the worker of its audit row.
const DependencyCancelledBy = "dependency"

// hasDependencies reports whether the task waits for others.
func (nt NewTask) hasDependencies() bool {
	return len(nt.DependsOn) > 0 || len(nt.DependsOnRefs) > 0
}

// checkDependencies checks the dependency fields of one task (the refs
// against the batch are checkRefs').
func (nt NewTask) checkDependencies() *FieldError {
	switch nt.OnDependencyFailure {
	case "", OnFailureCancel, OnFailureRun:
	default:
		return &FieldError{Field: "on_dependency_failure", Msg: fmt.Sprintf("on_dependency_failure must be %q or %q, got %q",
			OnFailureCancel, OnFailureRun, clipRef(nt.OnDependencyFailure))}
	}
	if n := len(nt.DependsOn) + len(nt.DependsOnRefs); n > MaxDependencies {
		return &FieldError{Field: "depends_on", Msg: fmt.Sprintf("depends_on has %d dependencies, the limit is %d", n, MaxDependencies)}
	}
	if ferr := CheckName("ref", nt.Ref, MaxRefLength); ferr != nil {
		return ferr
	}
	for _, id := range nt.DependsOn {
		if id == uuid.Nil {
			return &FieldError{Field: "depends_on", Msg: "depends_on: the nil id names no task"}
		}
	}
	for _, r := range nt.DependsOnRefs {
		if r == "" {
			return &FieldError{Field: "depends_on", Msg: "depends_on: an empty ref names no item"}
		}
	}
	return nil
}

func clipRef(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// checkRefs checks the refs of a batch: unique, each DependsOnRefs entry
// the Ref of another item, and no cycle among them.
func checkRefs(items []prepared) *FieldError {
	byRef := map[string]int{}
	for i, it := range items {
		if it.Ref == "" {
			continue
		}
		if j, ok := byRef[it.Ref]; ok {
			return &FieldError{Field: "ref", Msg: fmt.Sprintf("task %d: ref %q is also the ref of task %d", i, clipRef(it.Ref), j)}
		}
		byRef[it.Ref] = i
	}
	for i, it := range items {
		for _, r := range it.DependsOnRefs {
			if _, ok := byRef[r]; !ok {
				return &FieldError{Field: "depends_on", Msg: fmt.Sprintf("task %d: depends_on: ref %q names no item of the batch", i, clipRef(r))}
			}
		}
	}
	// A depth-first search; state 1: on the path, 2: done.
	state := make([]int, len(items))
	var path []string
	var visit func(i int) *FieldError
	visit = func(i int) *FieldError {
		state[i] = 1
		path = append(path, items[i].Ref)
		for _, r := range items[i].DependsOnRefs {
			j := byRef[r]
			switch state[j] {
			case 1:
				k := slices.Index(path, r)
				cycle := append(slices.Clone(path[k:]), r)
				return &FieldError{Field: "depends_on", Msg: fmt.Sprintf("task %d: depends_on: the refs form a cycle: %s", i, strings.Join(cycle, " -> "))}
			case 0:
				if ferr := visit(j); ferr != nil {
					return ferr
				}
			}
		}
		path = path[:len(path)-1]
		state[i] = 2
		return nil
	}
	for i := range items {
		if state[i] == 0 {
			if ferr := visit(i); ferr != nil {
				return ferr
			}
		}
	}
	return nil
}

// insertHeld writes the held outbox row of each new task of ids to
// stream: due at HeldUntil, so that no relay publishes it before its
// release replaces it.
func insertHeld(ctx context.Context, tx pgx.Tx, stream string, ids []uuid.UUID) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outbox_row (task_id, stream, next_retry_at)
SELECT id, $2, $3 FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, ord) ORDER BY ord`, ids, stream, HeldUntil); err != nil {
		return fmt.Errorf("insert %d held outbox events: %w", len(ids), err)
	}
	return nil
}

// lockDependenciesSQL locks the existing tasks named as dependencies, in
// id order, and reads what the new edges need: a dependency cannot end
// (its end is an UPDATE of the row) until the transaction that adds an
// edge to it has ended, so its end sees the edge, or the edge is created
// knowing its end.
const lockDependenciesSQL = `
SELECT id, status, workflow_id, coalesce(dependency_depth, 0) FROM ingest_task
WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE`

// linkSQL writes the edges ($1 dependents, $2 their dependencies) and the
// dependents' columns ($3 ids, $4 added to waiting_for (a sequence edge
// may count there already), $5 policy, $6 workflow,
// $7 depth); the roots $8 (dependencies without a workflow) become the
// roots of their own.
const linkSQL = `
WITH edges AS (
    INSERT INTO ingest_task_dependency (task_id, depends_on)
    SELECT * FROM unnest($1::uuid[], $2::uuid[])
), roots AS (
    UPDATE ingest_task SET workflow_id = id WHERE id = ANY($8::uuid[]) AND workflow_id IS NULL
)
UPDATE ingest_task t SET waiting_for = coalesce(t.waiting_for, 0) + x.n, on_dependency_failure = NULLIF(x.p, ''), workflow_id = x.w, dependency_depth = x.d
FROM unnest($3::uuid[], $4::int[], $5::text[], $6::uuid[], $7::int[]) AS x(id, n, p, w, d)
WHERE t.id = x.id`

// linkDependencies creates the edges of the new tasks of items that have
// dependencies (those res holds as created, not Existing), after they and
// their held outbox rows were inserted: it checks that every dependency
// exists (an unknown or deleted id is a FieldError naming it) and the
// depth limit, sets the dependents' waiting_for (the number of their
// edges), on_dependency_failure, workflow_id (that of their first
// dependency; a dependency in none is the root of its own) and
// dependency_depth, and applies the end of the dependencies that have
// ended already, as their end would have (ingest_task_end_edges): a
// SUCCEEDED one releases its edge at once; a DEAD or CANCELLED one
// releases it under OnFailureRun, and cancels the new task under
// OnFailureCancel. A task released of all its edges is published at once.
func linkDependencies(ctx context.Context, tx pgx.Tx, items []prepared, res []CreateResult) error {
	var dependents []int
	byRef := map[string]int{}
	for i, it := range items {
		if it.Ref != "" {
			byRef[it.Ref] = i
		}
		if it.hasDependencies() && !res[i].Existing {
			dependents = append(dependents, i)
		}
	}
	if len(dependents) == 0 {
		return nil
	}
	created := map[uuid.UUID]int{} // the dependents' ids
	for _, i := range dependents {
		created[res[i].Task.ID] = i
	}
	// The dependencies of each dependent, and the existing ones among all.
	deps := make(map[int][]uuid.UUID, len(dependents))
	var existing []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, i := range dependents {
		var ds []uuid.UUID
		add := func(id uuid.UUID) {
			if !slices.Contains(ds, id) {
				ds = append(ds, id)
			}
			if _, isNew := created[id]; !isNew && !seen[id] {
				seen[id] = true
				existing = append(existing, id)
			}
		}
		for _, id := range items[i].DependsOn {
			add(id)
		}
		for _, r := range items[i].DependsOnRefs {
			add(res[byRef[r]].Task.ID)
		}
		deps[i] = ds
	}
	type depRow struct {
		status   State
		workflow *uuid.UUID
		depth    int
	}
	found := map[uuid.UUID]depRow{}
	if len(existing) > 0 {
		rows, err := tx.Query(ctx, lockDependenciesSQL, existing)
		if err != nil {
			return fmt.Errorf("lock dependencies: %w", err)
		}
		for rows.Next() {
			var id uuid.UUID
			var d depRow
			if err := rows.Scan(&id, &d.status, &d.workflow, &d.depth); err != nil {
				rows.Close()
				return fmt.Errorf("lock dependencies: %w", err)
			}
			found[id] = d
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("lock dependencies: %w", err)
		}
	}
	for _, i := range dependents {
		for _, id := range deps[i] {
			if _, isNew := created[id]; isNew {
				continue
			}
			if _, ok := found[id]; !ok {
				return &FieldError{Field: "depends_on", Msg: fmt.Sprintf("%sdepends_on: no task %s (unknown or deleted)", itemPrefix(items, i), id)}
			}
		}
	}
	// Depth and workflow in dependency order: a dependent after the new
	// tasks it depends on (checkRefs has refused cycles).
	depth := map[uuid.UUID]int{}
	workflow := map[uuid.UUID]uuid.UUID{}
	var roots []uuid.UUID
	for id, d := range found {
		depth[id] = d.depth
		if d.workflow != nil {
			workflow[id] = *d.workflow
		}
	}
	done := map[int]bool{}
	var visit func(i int) *FieldError
	visit = func(i int) *FieldError {
		if done[i] {
			return nil
		}
		done[i] = true
		id := res[i].Task.ID
		d := 0
		for _, dep := range deps[i] {
			if j, isNew := created[dep]; isNew {
				if ferr := visit(j); ferr != nil {
					return ferr
				}
			}
			d = max(d, depth[dep]+1)
			if _, ok := workflow[dep]; !ok {
				// A dependency in no workflow is a root: of its own.
				workflow[dep] = dep
				roots = append(roots, dep)
			}
		}
		if d > MaxDependencyDepth {
			return &FieldError{Field: "depends_on", Msg: fmt.Sprintf("%sdepends_on: the task would be %d dependencies deep, the limit is %d",
				itemPrefix(items, i), d, MaxDependencyDepth)}
		}
		depth[id] = d
		workflow[id] = workflow[deps[i][0]]
		return nil
	}
	for _, i := range dependents {
		if ferr := visit(i); ferr != nil {
			return ferr
		}
	}
	var from, to, ids, wfs []uuid.UUID
	var ns, ds []int32
	var ps []string
	for _, i := range dependents {
		id := res[i].Task.ID
		for _, dep := range deps[i] {
			from, to = append(from, id), append(to, dep)
		}
		ids, wfs = append(ids, id), append(wfs, workflow[id])
		ns, ds = append(ns, int32(len(deps[i]))), append(ds, int32(depth[id]))
		ps = append(ps, items[i].OnDependencyFailure)
	}
	var endedIDs []uuid.UUID
	var ends []string
	for _, id := range existing {
		if st := found[id].status; st.Terminal() {
			endedIDs, ends = append(endedIDs, id), append(ends, string(st))
		}
	}
	b := &pgx.Batch{}
	b.Queue(linkSQL, from, to, ids, ns, ps, wfs, ds, roots)
	if len(endedIDs) > 0 {
		b.Queue(`SELECT ingest_task_end_edges($1::uuid[], $2::text[])`, endedIDs, ends)
	}
	b.Queue(`SELECT id, status, coalesce(waiting_for, 0), workflow_id, coalesce(dependency_depth, 0), finished_at,
    cancel_requested_at, coalesce(cancel_reason, ''), coalesce(cancel_requested_by, ''), updated_at
FROM ingest_task WHERE id = ANY($1::uuid[])`, ids).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id uuid.UUID
			var t Task
			if err := rows.Scan(&id, &t.Status, &t.WaitingFor, &t.WorkflowID, &t.DependencyDepth, &t.FinishedAt,
				&t.CancelRequestedAt, &t.CancelReason, &t.CancelRequestedBy, &t.UpdatedAt); err != nil {
				return err
			}
			r := &res[created[id]].Task
			r.Status, r.WaitingFor, r.WorkflowID, r.DependencyDepth, r.FinishedAt = t.Status, t.WaitingFor, t.WorkflowID, t.DependencyDepth, t.FinishedAt
			r.CancelRequestedAt, r.CancelReason, r.CancelRequestedBy, r.UpdatedAt = t.CancelRequestedAt, t.CancelReason, t.CancelRequestedBy, t.UpdatedAt
			r.OnDependencyFailure = items[created[id]].OnDependencyFailure
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("link %d dependents: %w", len(ids), err)
	}
	// Items that are the same task as a dependent (sameAs) see its row.
	for i, it := range items {
		if it.sameAs >= 0 {
			res[i].Task = res[it.sameAs].Task
		}
	}
	return nil
}

// itemPrefix names item i in an error of a batch of more than one.
func itemPrefix(items []prepared, i int) string {
	if len(items) > 1 {
		return fmt.Sprintf("task %d: ", i)
	}
	return ""
}

// Edge is one dependency of a task, or one dependent, as Get shows it.
type Edge struct {
	// ID is the other task's id; Kind and Status its kind and state ("" when
	// it was deleted).
	ID     uuid.UUID `json:"id"`
	Kind   string    `json:"kind,omitempty"`
	Status State     `json:"status,omitempty"`
	// Reason is "dependency" or "sequence".
	Reason string `json:"reason"`
	// ReleasedAt is when the dependency's end released the dependent from
	// this edge; nil: still holding.
	ReleasedAt *time.Time `json:"released_at,omitempty"`
}

// Dependencies returns the edges of task id: its dependencies and its
// dependents, each with the other task's kind and state, oldest first (at
// most limit of each; limit <= 0: MaxDependencies).
func Dependencies(ctx context.Context, db DB, id uuid.UUID, limit int) (dependsOn, dependents []Edge, err error) {
	if limit <= 0 {
		limit = MaxDependencies
	}
	rows, err := db.Query(ctx, `
(SELECT true, e.depends_on, coalesce(t.kind, ''), coalesce(t.status, ''), e.reason, e.released_at
 FROM ingest_task_dependency e LEFT JOIN ingest_task t ON t.id = e.depends_on
 WHERE e.task_id = $1 ORDER BY e.depends_on LIMIT $2)
UNION ALL
(SELECT false, e.task_id, t.kind, t.status, e.reason, e.released_at
 FROM ingest_task_dependency e JOIN ingest_task t ON t.id = e.task_id
 WHERE e.depends_on = $1 ORDER BY e.task_id LIMIT $2)`, id, limit)
	if err != nil {
		return nil, nil, fmt.Errorf("read the dependencies of task %s: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var up bool
		var e Edge
		if err := rows.Scan(&up, &e.ID, &e.Kind, &e.Status, &e.Reason, &e.ReleasedAt); err != nil {
			return nil, nil, fmt.Errorf("read the dependencies of task %s: %w", id, err)
		}
		if up {
			dependsOn = append(dependsOn, e)
		} else {
			dependents = append(dependents, e)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read the dependencies of task %s: %w", id, err)
	}
	return dependsOn, dependents, nil
}

// DependencyResults returns the results of task id's dependencies (its
// 'dependency' edges), keyed by dependency id: a dependency that ended
// without a result, or was deleted, maps to JSON null. A task without
// dependencies gets an empty map; call it only for tasks with
// DependencyDepth > 0.
func DependencyResults(ctx context.Context, db DB, id uuid.UUID) (map[uuid.UUID]json.RawMessage, error) {
	rows, err := db.Query(ctx, `
SELECT e.depends_on, t.result FROM ingest_task_dependency e LEFT JOIN ingest_task t ON t.id = e.depends_on
WHERE e.task_id = $1 AND e.reason = 'dependency'`, id)
	if err != nil {
		return nil, fmt.Errorf("read the results of the dependencies of task %s: %w", id, err)
	}
	defer rows.Close()
	out := map[uuid.UUID]json.RawMessage{}
	for rows.Next() {
		var dep uuid.UUID
		var r []byte
		if err := rows.Scan(&dep, &r); err != nil {
			return nil, fmt.Errorf("read the results of the dependencies of task %s: %w", id, err)
		}
		if r == nil {
			r = []byte("null")
		}
		out[dep] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the results of the dependencies of task %s: %w", id, err)
	}
	return out, nil
}

// DependencyResults is DependencyResults on the store's pool, each result
// opened with the store's keyring (results are stored encrypted when
// encryption at rest is on): a result it cannot open is an error, so the
// dependent's run fails as an attempt rather than receiving a ciphertext.
func (s *Store) DependencyResults(ctx context.Context, id uuid.UUID) (map[uuid.UUID]json.RawMessage, error) {
	deps, err := DependencyResults(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	for dep, r := range deps {
		pt, err := s.cfg.Keyring.Open(seal.Result, dep, r)
		if err != nil {
			return nil, fmt.Errorf("the result of dependency %s: %w", dep, err)
		}
		deps[dep] = pt
	}
	return deps, nil
}

// Dependencies is Dependencies on the store's pool.
func (s *Store) Dependencies(ctx context.Context, id uuid.UUID, limit int) (dependsOn, dependents []Edge, err error) {
	return Dependencies(ctx, s.db, id, limit)
}
