package task

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/transition"
)

// Get returns one task with its payload, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id uuid.UUID) (Task, error) {
	var pc pipelineScan
	t, err := scanTask(s.db.QueryRow(ctx, `SELECT `+taskColumns+`, `+pipelineColumns+` FROM ingest_task WHERE id = $1`, id), pc.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Task{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	pc.fill(&t)
	s.openPayload(&t)
	s.openResult(&t)
	ts := []Task{t}
	if err := s.fillParkReasons(ctx, ts); err != nil {
		return Task{}, fmt.Errorf("get task %s: %w", id, err)
	}
	return ts[0], nil
}

// GetWithTransitions returns a task and its audit trail, oldest first.
func (s *Store) GetWithTransitions(ctx context.Context, id uuid.UUID) (Task, []transition.Record, error) {
	t, err := s.Get(ctx, id)
	if err != nil {
		return Task{}, nil, err
	}
	recs, err := transition.List(ctx, s.db, id)
	return t, recs, err
}

// ListParams filters and pages List.
type ListParams struct {
	Status State // "" for any
	// Scheduled selects the tasks that wait for a later time: QUEUED or
	// RETRYING with a next_retry_at in the future (a delayed task, a
	// retry in its backoff). With Status set, it narrows to that state.
	Scheduled bool
	Kind      string // "" for any
	// Workflow selects the tasks of one pipeline (their workflow_id: the
	// id of its root task); the zero UUID for any.
	Workflow uuid.UUID
	// Since and Until bound created_at to [Since, Until); zero: open.
	Since, Until time.Time
	Limit        int // 1..1000; 0 means 50
	// Cursor continues a listing where the previous page ended ("" for the
	// first page).
	Cursor string
}

// MaxListLimit bounds ListParams.Limit.
const MaxListLimit = 1000

// ScheduledFilter is the value of a listing's status filter that selects
// ListParams.Scheduled (the API's ?status=scheduled, the dashboard's
// "scheduled" link): not a state, the waiting ones due later.
const ScheduledFilter = "SCHEDULED"

// SetStatus sets the status filter of p from v, a state or
// ScheduledFilter in any case ("": any), or returns a *FieldError naming
// the status field: the one reading of the filter for the API and the
// dashboard.
func (p *ListParams) SetStatus(v string) *FieldError {
	p.Status, p.Scheduled = "", false
	switch up := State(strings.ToUpper(v)); {
	case up == "":
	case up == ScheduledFilter:
		p.Scheduled = true
	case up.Valid():
		p.Status = up
	default:
		return &FieldError{Field: "status", Msg: fmt.Sprintf("status %q is not one of %v or %s", v, States, strings.ToLower(ScheduledFilter))}
	}
	return nil
}

// List returns tasks newest first, without payloads, and the cursor of the
// next page ("" when this page is the last). Newest first is by id (a
// UUIDv7 begins with its creation time); pages are keyset-paginated on it,
// through the primary key, (kind, id), or a state's source and partial
// index (stateSource, stateScope), so a listing stays consistent while
// tasks are added.
func (s *Store) List(ctx context.Context, p ListParams) ([]Task, string, error) {
	if p.Status != "" && !p.Status.Valid() {
		return nil, "", &FieldError{Field: "status", Msg: fmt.Sprintf("status %q is not one of %v", p.Status, States)}
	}
	if p.Limit == 0 {
		p.Limit = 50
	}
	if ferr := ListLimitRange.Check(int64(p.Limit)); ferr != nil {
		return nil, "", ferr
	}
	if ferr := CheckText("kind", p.Kind); ferr != nil {
		return nil, "", ferr
	}
	var where []string
	var args []any
	from := `ingest_task`
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	if p.Status != "" {
		from = stateSource("ingest_task", p.Status)
		where = append(where, "status = "+arg(string(p.Status)), stateScope("ingest_task", p.Status))
	}
	if p.Scheduled {
		from = liveTasks("ingest_task")
		where = append(where, scheduled("ingest_task"))
	}
	if p.Kind != "" {
		where = append(where, "kind = "+arg(p.Kind))
	}
	if p.Workflow != uuid.Nil {
		// Through ingest_task_workflow_idx: the pipeline's tasks, then
		// sorted by id.
		where = append(where, "workflow_id = "+arg(p.Workflow))
	}
	if !p.Since.IsZero() {
		where = append(where, "created_at >= "+arg(p.Since))
	}
	if !p.Until.IsZero() {
		where = append(where, "created_at < "+arg(p.Until))
	}
	if p.Cursor != "" {
		_, id, err := decodeCursor(p.Cursor)
		if err != nil {
			return nil, "", err
		}
		where = append(where, "id < "+arg(id))
	}
	q := `SELECT ` + taskColumnsNoPayload + ` FROM ` + from
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC LIMIT " + arg(p.Limit+1)
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list tasks: %w", err)
	}
	sc := newTaskScanner()
	tasks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Task, error) { return sc.scan(r) })
	if err != nil {
		return nil, "", fmt.Errorf("list tasks: %w", err)
	}
	next := ""
	if len(tasks) > p.Limit {
		tasks = tasks[:p.Limit]
		last := tasks[len(tasks)-1]
		next = encodeCursor(last.CreatedAt, last.ID)
	}
	if err := s.fillParkReasons(ctx, tasks); err != nil {
		return nil, "", fmt.Errorf("list tasks: %w", err)
	}
	return tasks, next, nil
}

// fillParkReasons sets the ParkedReason of the parked tasks of ts from
// their kinds' settings now (one query, only when one is parked).
func (s *Store) fillParkReasons(ctx context.Context, ts []Task) error {
	var kinds []string
	for _, t := range ts {
		if t.Parked() {
			kinds = append(kinds, t.Kind)
		}
	}
	if len(kinds) == 0 {
		return nil
	}
	rows, err := s.db.Query(ctx, `SELECT kind FROM ingest_kind WHERE paused AND kind = ANY($1)`, kinds)
	if err != nil {
		return err
	}
	paused, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for i := range ts {
		if ts[i].Parked() {
			ts[i].ParkedReason = ParkReason(slices.Contains(paused, ts[i].Kind))
		}
	}
	return nil
}

func encodeCursor(at time.Time, id uuid.UUID) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "|" + id.String()))
}

func decodeCursor(c string) (time.Time, uuid.UUID, error) {
	bad := &FieldError{Field: "cursor", Msg: fmt.Sprintf("cursor %q is not one this server returned", clip.String(c, 100))}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, uuid.UUID{}, bad
	}
	at, idStr, ok := strings.Cut(string(raw), "|")
	if !ok {
		return time.Time{}, uuid.UUID{}, bad
	}
	t, err1 := time.Parse(time.RFC3339Nano, at)
	id, err2 := uuid.Parse(idStr)
	if err1 != nil || err2 != nil {
		return time.Time{}, uuid.UUID{}, bad
	}
	return t, id, nil
}
