package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// pageSize is how many tasks the tasks page lists.
const pageSize = 50

// tasksView is the tasks page.
type tasksView struct {
	Status, Kind, Q, Since, Until string
	// Workflow is the pipeline filter: a root task's id ("" any).
	Workflow    string
	Tasks       []task.Task
	Next, First string // links ("" when none)
	Cursor      string
	Error       string
	Note        string
	MaxAttempts int
	// Here is this listing's address (its filters and page), where a bulk
	// action comes back to; SelectAll and SelectNone are it with every
	// box of the page ticked, and with none.
	Here, SelectAll, SelectNone string
	// AllSelected: every box of the page is ticked (?select=all).
	AllSelected bool
	// Statuses are the status filter's values: the states and
	// "scheduled" (QUEUED or RETRYING, due later).
	Statuses []string
}

// statusFilters are the values of the tasks page's status filter.
var statusFilters = func() []string {
	out := []string{}
	for _, s := range task.States {
		out = append(out, string(s))
	}
	return append(out, task.ScheduledFilter)
}()

// dueLater returns when a waiting task (QUEUED or RETRYING) is next due,
// when that is in the future; nil when it is due (or not waiting): the
// tasks page's Due column.
func dueLater(t task.Task) *time.Time {
	if (t.Status == task.Queued || t.Status == task.Retrying) && t.NextRetryAt != nil && t.NextRetryAt.After(time.Now()) {
		return t.NextRetryAt
	}
	return nil
}

// keySQL finds the tasks with idempotency key $1 (of kind $2, "" any)
// through the unique (kind, idempotency_key) index: the kinds are
// enumerated by a loose scan of ingest_task_kind_idx (one index
// probe per kind), and each probed with the key.
const keySQL = `
WITH RECURSIVE k AS (
    (SELECT kind FROM ingest_task ORDER BY kind LIMIT 1)
    UNION ALL
    SELECT (SELECT t.kind FROM ingest_task t WHERE t.kind > k.kind ORDER BY t.kind LIMIT 1) FROM k WHERE k.kind IS NOT NULL
)
SELECT x.id FROM k CROSS JOIN LATERAL (
    SELECT t.id FROM ingest_task t WHERE t.kind = k.kind AND t.idempotency_key = $1
) x
WHERE k.kind IS NOT NULL AND ($2 = '' OR k.kind = $2)
LIMIT 100`

// parseTime reads a filter time: RFC 3339, or the "2006-01-02T15:04"
// of a datetime-local input, taken as UTC.
func parseTime(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (2026-11-24T09:00 or RFC 3339; UTC)", v)
}

func (h *Handler) tasks(w http.ResponseWriter, r *http.Request, v *view) {
	q := r.URL.Query()
	tv := &tasksView{Status: strings.ToUpper(q.Get("status")), Kind: q.Get("kind"), Q: strings.TrimSpace(q.Get("q")),
		Since: q.Get("since"), Until: q.Get("until"), Workflow: strings.TrimSpace(q.Get("workflow")), Cursor: q.Get("cursor"), MaxAttempts: h.cfg.MaxAttempts,
		AllSelected: q.Get("select") == "all", Statuses: statusFilters}
	v.Title, v.Nav, v.D = "Tasks", "tasks", tv
	here := url.Values{}
	for _, k := range []string{"status", "kind", "q", "since", "until", "workflow", "cursor"} {
		if q.Get(k) != "" {
			here.Set(k, q.Get(k))
		}
	}
	link := func(extra ...string) string {
		u := url.Values{}
		for k, vs := range here {
			u[k] = vs
		}
		for i := 0; i+1 < len(extra); i += 2 {
			u.Set(extra[i], extra[i+1])
		}
		if len(u) == 0 {
			return Prefix + "tasks"
		}
		return Prefix + "tasks?" + u.Encode()
	}
	tv.Here, tv.SelectNone, tv.SelectAll = link(), link(), link("select", "all")
	v.Live = link("live", "1")
	code := http.StatusOK
	bad := func(msg string) {
		tv.Error, code = msg, http.StatusBadRequest
		h.render(w, r, code, "tasks", v)
	}
	p := task.ListParams{Kind: tv.Kind, Cursor: tv.Cursor, Limit: pageSize}
	if ferr := p.SetStatus(tv.Status); ferr != nil {
		bad(ferr.Msg)
		return
	}
	var err error
	if p.Since, err = parseTime(tv.Since); err != nil {
		bad("since: " + err.Error())
		return
	}
	if p.Until, err = parseTime(tv.Until); err != nil {
		bad("until: " + err.Error())
		return
	}
	if tv.Workflow != "" {
		if p.Workflow, err = uuid.Parse(tv.Workflow); err != nil {
			bad(fmt.Sprintf("workflow: %q is not a workflow id (the UUID of its root task)", clip(tv.Workflow, 100)))
			return
		}
	}
	for _, f := range []struct{ field, v string }{{"kind", tv.Kind}, {"q", tv.Q}} {
		if ferr := task.CheckText(f.field, f.v); ferr != nil {
			bad(ferr.Msg)
			return
		}
	}
	ctx := r.Context()
	switch id, perr := uuid.Parse(tv.Q); {
	case tv.Q != "" && perr == nil:
		t, err := h.cfg.Store.Get(ctx, id)
		if errors.Is(err, task.ErrNotFound) {
			tv.Note = "No task has the id " + tv.Q + "."
		} else if err != nil {
			h.internal(w, r, err)
			return
		} else {
			tv.Tasks = []task.Task{t}
		}
	case tv.Q != "":
		rows, err := h.cfg.DB.Query(ctx, keySQL, tv.Q, tv.Kind)
		if err != nil {
			h.internal(w, r, err)
			return
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			h.internal(w, r, err)
			return
		}
		for _, id := range ids {
			t, err := h.cfg.Store.Get(ctx, id)
			if err == nil {
				t.Payload = nil
				tv.Tasks = append(tv.Tasks, t)
			}
		}
		if len(tv.Tasks) == 0 {
			tv.Note = fmt.Sprintf("No task has the id or idempotency key %q.", tv.Q)
		}
	default:
		tasks, next, err := h.cfg.Store.List(ctx, p)
		if errors.Is(err, task.ErrInvalidTask) {
			bad(err.Error())
			return
		}
		if err != nil {
			h.internal(w, r, err)
			return
		}
		tv.Tasks = tasks
		if next != "" {
			tv.Next = link("cursor", next)
		}
		if tv.Cursor != "" {
			delete(here, "cursor")
			tv.First = link()
		}
	}
	h.render(w, r, code, "tasks", v)
}

// taskView is a task's page: what `ingest-worker task show` shows.
type taskView struct {
	Task        task.Task
	Allowed     string
	TraceID     string
	Transitions []transition.Record
	Outbox      []outbox.Event
	Entries     []stream.EntryState
	DLQ         []dlq.Entry
	DLQScanned  int
	DLQKey      string
	Stream      string
	Group       string
	RedisErr    string
	HasRedis    bool
	// Graph is the task's pipeline: workflow, dependencies, dependents.
	Graph *graphView
}

// CanRunNow tells whether the task waits for a later time (QUEUED or
// RETRYING, due in the future, not parked): the "Run now" button.
func (v *taskView) CanRunNow() bool {
	t := v.Task
	return (t.Status == task.Queued || t.Status == task.Retrying) && !t.Parked() &&
		t.NextRetryAt != nil && t.NextRetryAt.After(time.Now())
}

// resultView is a task's result as its page shows it: indented, cut
// after resultLines lines or resultBytes bytes (the API has all of it).
type resultView struct {
	Text  string
	Cut   bool
	Bytes int64
}

// The most of a result a task's page shows.
const (
	resultLines = 200
	resultBytes = 64 << 10
)

// Result is the task's result for the page; nil when it has none.
func (v *taskView) Result() *resultView {
	if v.Task.Result == nil {
		return nil
	}
	text, cut := task.ResultPreview(v.Task.Result, resultLines, resultBytes)
	return &resultView{Text: text, Cut: cut, Bytes: int64(len(v.Task.Result))}
}

// CanDelete tells whether the task is terminal: the "Delete task" button.
func (v *taskView) CanDelete() bool { return v.Task.Status.Terminal() }

// dlqScan bounds the DLQ entries a task's page searches, newest first.
const dlqScan = 5000

func (h *Handler) taskPage(w http.ResponseWriter, r *http.Request, v *view) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a task id (a UUID)", r.PathValue("id")))
		return
	}
	tv, err := h.explain(r.Context(), id)
	if errors.Is(err, task.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "no task "+id.String())
		return
	}
	if err != nil {
		h.internal(w, r, err)
		return
	}
	v.Title, v.Nav, v.Live, v.D = "Task "+id.String(), "tasks", Prefix+"tasks/"+id.String()+"?live=1", tv
	h.render(w, r, http.StatusOK, "task", v)
}

// explain gathers everything known about one task: its row, audit trail,
// outbox rows, its stream entries' PEL state and its DLQ entries.
func (h *Handler) explain(ctx context.Context, id uuid.UUID) (*taskView, error) {
	tv := &taskView{Stream: h.cfg.Stream, Group: h.cfg.Group, DLQKey: h.cfg.DLQKey, HasRedis: h.cfg.Redis != nil}
	var err error
	tv.Task, tv.Transitions, err = h.cfg.Store.GetWithTransitions(ctx, id)
	if err != nil {
		return nil, err
	}
	if tv.Task.MaxAttempts != nil {
		tv.Allowed = fmt.Sprintf("%d (the task's max_attempts)", *tv.Task.MaxAttempts)
	} else {
		tv.Allowed = fmt.Sprintf("%d (the workers' setting; the task sets none)", h.cfg.MaxAttempts)
	}
	if parts := strings.Split(tv.Task.Traceparent, "-"); len(parts) == 4 {
		tv.TraceID = parts[1]
	}
	if tv.Outbox, err = outbox.TaskEvents(ctx, h.cfg.DB, id); err != nil {
		return nil, err
	}
	if tv.Graph, err = dependencyGraph(ctx, h.cfg.DB, id); err != nil {
		return nil, err
	}
	if h.cfg.Redis != nil {
		rctx, cancel := context.WithTimeout(ctx, redisWait)
		defer cancel()
		if err := h.redisStateOf(rctx, tv); err != nil {
			tv.RedisErr = h.problem(ctx, "Redis", err)
		}
	}
	return tv, nil
}

// redisStateOf fills in the Redis state of the task's stream entries and
// its DLQ entries, as task show does.
func (h *Handler) redisStateOf(ctx context.Context, tv *taskView) error {
	for _, o := range tv.Outbox {
		if o.StreamID == "" {
			continue
		}
		e, err := stream.InspectEntry(ctx, h.cfg.Redis, o.Stream, h.cfg.Group, o.StreamID)
		if err != nil {
			return err
		}
		tv.Entries = append(tv.Entries, e)
	}
	if h.cfg.DLQKey == "" {
		return nil
	}
	var err error
	tv.DLQ, tv.DLQScanned, err = dlq.FindTask(ctx, h.cfg.Redis, h.cfg.DLQKey, tv.Task.ID.String(), dlqScan)
	return err
}

// cancel cancels a task (task.Store.Cancel).
func (h *Handler) cancel(w http.ResponseWriter, r *http.Request) {
	id, back, ok := h.actionTarget(w, r)
	if !ok {
		return
	}
	if !confirmed(r) {
		h.done(w, r, back, true, "Not cancelled: tick the confirmation box first.")
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	res, err := h.cfg.Store.Cancel(r.Context(), h.cfg.Actor, reason, id)
	if errors.Is(err, task.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "no task "+id.String())
		return
	}
	if ferr := (*task.FieldError)(nil); errors.As(err, &ferr) {
		// The reason: too long, or bytes PostgreSQL cannot store.
		h.done(w, r, back, true, "%s", ferr.Msg)
		return
	}
	if err != nil {
		h.internal(w, r, err)
		return
	}
	switch res.Outcome {
	case task.CancelDone:
		h.done(w, r, back, false, "Task cancelled.")
	case task.CancelRequested:
		h.done(w, r, back, false, "Cancel requested: the task is RUNNING on %s and ends CANCELLED when its handler returns.", res.Task.LeaseOwner)
	default:
		h.done(w, r, back, true, "The task is %s; only QUEUED, RETRYING and RUNNING tasks can be cancelled.", res.Task.Status)
	}
}

// redrive redrives a DEAD or CANCELLED task and removes its DLQ entries,
// as dlq replay does.
func (h *Handler) redrive(w http.ResponseWriter, r *http.Request) {
	id, back, ok := h.actionTarget(w, r)
	if !ok {
		return
	}
	res, n, err := dlq.Redrive(r.Context(), h.cfg.Redis, h.cfg.DLQKey, h.cfg.Store, h.cfg.Actor, id)
	if rerr := (*dlq.RemoveError)(nil); errors.As(err, &rerr) {
		h.log.ErrorContext(r.Context(), "ui redrive: DLQ entry not removed", "task_id", id, "err", err)
		h.done(w, r, back, true, "Task redriven (QUEUED), but its DLQ entry was not removed (see the server's log); replay it from the DLQ page to remove it.")
		return
	}
	if err != nil {
		h.internal(w, r, err)
		return
	}
	switch rr := res[0]; {
	case rr.Applied:
		h.done(w, r, back, false, "Task redriven: QUEUED again with a new outbox event; %d DLQ entries removed.", n)
	case rr.Status == "":
		h.fail(w, r, http.StatusNotFound, "no task "+id.String())
	default:
		h.done(w, r, back, true, "The task is %s; only DEAD and CANCELLED tasks can be redriven.", rr.Status)
	}
}

// confirmed tells whether the form's confirmation box was ticked: the
// dashboard's destructive and forcing actions (cancel, delete, run now,
// discard, the task list's bulk actions) need it, so that a stray click does nothing. The box is required in the
// form; this check covers a browser that submits without it.
func confirmed(r *http.Request) bool { return r.PostFormValue("confirm") == "yes" }

// deleteTask deletes a terminal task with its audit rows, outbox rows and
// DLQ entries (dlq.Delete), logged with the actor and counted.
func (h *Handler) deleteTask(w http.ResponseWriter, r *http.Request) {
	id, back, ok := h.actionTarget(w, r)
	if !ok {
		return
	}
	if !confirmed(r) {
		h.done(w, r, back, true, "Not deleted: tick the confirmation box first.")
		return
	}
	res, n, err := dlq.Delete(r.Context(), h.cfg.Redis, h.cfg.DLQKey, h.cfg.Store, id)
	rerr := (*dlq.RemoveError)(nil)
	switch {
	case err != nil && !errors.As(err, &rerr):
		h.internal(w, r, err)
		return
	case len(res) == 0:
		h.fail(w, r, http.StatusNotFound, "no task "+id.String())
		return
	case !res[0].Deleted:
		h.done(w, r, back, true, "The task is %s; only SUCCEEDED, DEAD and CANCELLED tasks can be deleted.", res[0].Status)
		return
	}
	h.deleted.Inc()
	h.log.InfoContext(r.Context(), "task deleted", "task_id", id, "status", res[0].Status, "actor", h.cfg.Actor, "dlq_removed", n)
	if rerr != nil {
		h.log.ErrorContext(r.Context(), "ui delete: entries not removed from Redis", "task_id", id, "err", err)
		h.done(w, r, Prefix+"tasks", true, "Task %s deleted, but not all of its entries were removed from Redis (see the server's log); discard a DLQ entry left over from the DLQ page.", id)
		return
	}
	h.done(w, r, Prefix+"tasks", false, "Task %s deleted with its history; %d DLQ entries removed.", id, n)
}

// runNow makes a task that waits for a later time due now (task.RunNow).
func (h *Handler) runNow(w http.ResponseWriter, r *http.Request) {
	id, back, ok := h.actionTarget(w, r)
	if !ok {
		return
	}
	if !confirmed(r) {
		h.done(w, r, back, true, "Not run: tick the confirmation box first.")
		return
	}
	res, err := h.cfg.Store.RunNow(r.Context(), h.cfg.Actor, id)
	if errors.Is(err, task.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, "no task "+id.String())
		return
	}
	if err != nil {
		h.internal(w, r, err)
		return
	}
	if msg := res.Refusal(id); msg != "" {
		h.done(w, r, back, true, "%s", msg)
		return
	}
	h.done(w, r, back, false, "Task due now: it is published at once and the next free worker runs it.")
}

// actionTarget reads the task id of an action on a task's page
// (POST /ui/tasks/{id}/...) and the page to go back to; a path that holds
// no task id answers 400 and ok false.
func (h *Handler) actionTarget(w http.ResponseWriter, r *http.Request) (id uuid.UUID, back string, ok bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "not a task id")
		return uuid.Nil, "", false
	}
	return id, Prefix + "tasks/" + id.String(), true
}
