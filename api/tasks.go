package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// CreateRequest is the body of POST /v1/tasks and one element of the array
// POSTed to /v1/tasks:batch.
type CreateRequest struct {
	Kind           string          `json:"kind"`
	Payload        json.RawMessage `json:"payload"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	MaxAttempts    *int            `json:"max_attempts,omitempty"`
	// RunAt (RFC 3339) or DelayMS delays the task; at most one may be set.
	RunAt   string `json:"run_at,omitempty"`
	DelayMS int64  `json:"delay_ms,omitempty"`
	// TimeoutMS is the task's handler timeout; 0: the worker's default.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// SequenceKey puts the task in its kind's sequence of that key (one
	// at a time, in creation order).
	SequenceKey string `json:"sequence_key,omitempty"`
	// DependsOn lists the tasks this one waits for: task ids, and in a
	// batch also the Refs of its other items. OnDependencyFailure is
	// "cancel" (the default) or "run" (task.NewTask).
	DependsOn           []string `json:"depends_on,omitempty"`
	OnDependencyFailure string   `json:"on_dependency_failure,omitempty"`
	// Ref names an item of a batch for the depends_on of the others.
	Ref string `json:"ref,omitempty"`
}

// CreateResponse answers a created task (and each task of a batch).
type CreateResponse struct {
	ID     uuid.UUID  `json:"id"`
	Status task.State `json:"status"`
	// Existing is true when an idempotency key matched an existing task.
	Existing bool `json:"existing,omitempty"`
}

// BatchResponse answers POST /v1/tasks:batch, one entry per task in the
// order given.
type BatchResponse struct {
	Tasks []CreateResponse `json:"tasks"`
}

// ListResponse answers GET /v1/tasks.
type ListResponse struct {
	Tasks []task.Task `json:"tasks"`
	// NextCursor continues the listing (?cursor=); empty on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// TaskResponse answers GET /v1/tasks/{id}: the task's fields and its audit
// trail, oldest first.
type TaskResponse struct {
	task.Task
	// Result is the JSON the successful run returned, null when none;
	// Progress the current run's latest progress, null when none.
	Result      json.RawMessage     `json:"result"`
	Progress    *task.Progress      `json:"progress"`
	Transitions []transition.Record `json:"transitions"`
	// DependsOn and Dependents are the task's edges (at most
	// task.MaxDependencies of each), with the other task's state; the
	// task's waiting_for counts those still holding it.
	DependsOn  []task.Edge `json:"depends_on,omitempty"`
	Dependents []task.Edge `json:"dependents,omitempty"`
}

// RedriveResponse answers POST /v1/tasks/{id}/redrive.
type RedriveResponse struct {
	ID     uuid.UUID  `json:"id"`
	Status task.State `json:"status"`
	// DLQRemoved counts the DLQ entries of the task removed (those of its
	// last death; 0 without a DLQ or when their removal failed, which the
	// server logs).
	DLQRemoved int `json:"dlq_removed"`
	// Revived lists the dependents revived with with_dependents.
	Revived []uuid.UUID `json:"revived,omitempty"`
}

// RedriveRequest is the optional body of POST /v1/tasks/{id}/redrive.
type RedriveRequest struct {
	// WithDependents also revives the dependents the task's end cancelled
	// (and theirs): QUEUED again, held until it ends anew.
	WithDependents bool `json:"with_dependents,omitempty"`
}

// BulkRedriveRequest is the body of POST /v1/tasks/redrive: the filter
// (task.RedriveFilter: status DEAD or CANCELLED, kind, error_contains,
// since and until on finished_at as RFC 3339 times, limit, ids: only
// these tasks, e.g. those a dry run listed) and dry_run.
type BulkRedriveRequest struct {
	Status        string `json:"status"`
	Kind          string `json:"kind,omitempty"`
	ErrorContains string `json:"error_contains,omitempty"`
	Since         string `json:"since,omitempty"`
	Until         string `json:"until,omitempty"`
	Limit         int    `json:"limit,omitempty"`
	// IDs narrows the filter to these tasks: a redrive that follows a
	// dry run passes the dry run's ids, so that it acts on exactly what
	// the dry run listed.
	IDs    []string `json:"ids,omitempty"`
	DryRun bool     `json:"dry_run,omitempty"`
}

// filter returns the request's filter, or the 400 naming its bad field.
func (req BulkRedriveRequest) filter() (task.RedriveFilter, *inputError) {
	f := task.RedriveFilter{Status: task.State(strings.ToUpper(req.Status)), Kind: req.Kind,
		ErrorContains: req.ErrorContains, Limit: req.Limit}
	for i, v := range req.IDs {
		id, err := uuid.Parse(v)
		if err != nil {
			return f, badInput(fmt.Sprintf("ids[%d]", i), "ids[%d] %q is not a task id", i, clip.String(v, 64))
		}
		f.IDs = append(f.IDs, id)
	}
	for _, t := range []struct {
		field, in string
		out       *time.Time
	}{{"since", req.Since, &f.Since}, {"until", req.Until, &f.Until}} {
		if t.in == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339Nano, t.in)
		if err != nil {
			return f, badInput(t.field, "%s %q is not an RFC 3339 time (e.g. 2026-11-24T09:00:00Z)", t.field, t.in)
		}
		*t.out = v
	}
	f = f.WithDefaults()
	if err := f.Validate(); err != nil {
		var ferr *task.FieldError
		errors.As(err, &ferr)
		return f, badInput(ferr.Field, "%s", ferr.Msg)
	}
	return f, nil
}

// CancelRequest is the optional body of POST /v1/tasks/{id}/cancel.
type CancelRequest struct {
	Reason string `json:"reason,omitempty"`
}

// inputError is a 4xx answer naming the bad input.
type inputError struct {
	code  int
	msg   string
	field string
}

func (e *inputError) Error() string { return e.msg }

func badInput(field, format string, args ...any) *inputError {
	return &inputError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...), field: field}
}

func (s *Server) createTask(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if ierr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req, ""); ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	nt, ierr := s.newTask(req, "")
	if ierr == nil {
		ierr = singleDependencies(nt)
	}
	if ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	res, err := s.store.Create(tracing.ExtractHeader(r.Context(), r.Header), nt)
	if err != nil {
		s.storeError(w, r, err, "")
		return
	}
	if res.Existing {
		writeJSON(w, http.StatusOK, res.Task)
		return
	}
	writeJSON(w, http.StatusCreated, CreateResponse{ID: res.Task.ID, Status: res.Task.Status})
}

func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) {
	var raw []json.RawMessage
	if ierr := decodeJSON(w, r, s.cfg.MaxBatchBodyBytes, &raw, ""); ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	switch {
	case len(raw) == 0:
		writeError(w, http.StatusBadRequest, "the batch is empty", "")
		return
	case len(raw) > s.cfg.MaxBatchSize:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the batch has %d tasks, the limit is %d", len(raw), s.cfg.MaxBatchSize), "")
		return
	}
	nts := make([]task.NewTask, len(raw))
	for i, el := range raw {
		prefix := fmt.Sprintf("[%d]", i)
		var req CreateRequest
		if ierr := decodeStrict(el, &req, prefix); ierr != nil {
			writeError(w, ierr.code, ierr.msg, ierr.field)
			return
		}
		nt, ierr := s.newTask(req, prefix)
		if ierr != nil {
			writeError(w, ierr.code, ierr.msg, ierr.field)
			return
		}
		nts[i] = nt
	}
	batchRefs(nts)
	res, err := s.store.CreateBatch(tracing.ExtractHeader(r.Context(), r.Header), nts)
	if err != nil {
		s.storeError(w, r, batchFieldError(err), "")
		return
	}
	out := BatchResponse{Tasks: make([]CreateResponse, len(res))}
	code := http.StatusOK
	for i, c := range res {
		out.Tasks[i] = CreateResponse{ID: c.Task.ID, Status: c.Task.Status, Existing: c.Existing}
		if !c.Existing {
			code = http.StatusCreated
		}
	}
	writeJSON(w, code, out)
}

// FieldError is the bad field of a create request.
type FieldError = task.FieldError

// Validate checks a create request, with payloads limited to
// maxPayloadBytes, and returns the task to create. The HTTP API and the
// CLI's enqueue --file share it; the checks of the task itself are the
// store's (task.NewTask.Validate).
func (req CreateRequest) Validate(maxPayloadBytes int) (task.NewTask, *FieldError) {
	if len(req.Payload) == 0 || string(req.Payload) == "null" {
		return task.NewTask{}, &FieldError{Field: "payload", Msg: "payload is required (any JSON value but null)"}
	}
	nt := task.NewTask{Kind: strings.TrimSpace(req.Kind), Payload: req.Payload, IdempotencyKey: req.IdempotencyKey,
		SequenceKey: req.SequenceKey}
	if req.MaxAttempts != nil {
		// Given, it must be in range: 0 is not "none" here.
		if ferr := task.MaxAttemptsRange.Check(int64(*req.MaxAttempts)); ferr != nil {
			return task.NewTask{}, ferr
		}
		nt.MaxAttempts = *req.MaxAttempts
	}
	if req.RunAt != "" {
		at, err := time.Parse(time.RFC3339Nano, req.RunAt)
		if err != nil {
			return task.NewTask{}, &FieldError{Field: "run_at", Msg: fmt.Sprintf("run_at %q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", req.RunAt)}
		}
		nt.RunAt = at
	}
	var ferr *FieldError
	if nt.Delay, ferr = task.DelayRange.Millis(req.DelayMS); ferr != nil {
		return task.NewTask{}, ferr
	}
	if nt.Timeout, ferr = task.TimeoutRange.Millis(req.TimeoutMS); ferr != nil {
		return task.NewTask{}, ferr
	}
	nt.Ref, nt.OnDependencyFailure = req.Ref, req.OnDependencyFailure
	for _, d := range req.DependsOn {
		// A task id, else (in a batch) the ref of another item.
		if id, err := uuid.Parse(d); err == nil && len(d) == 36 {
			nt.DependsOn = append(nt.DependsOn, id)
		} else {
			nt.DependsOnRefs = append(nt.DependsOnRefs, d)
		}
	}
	if ferr := nt.Validate(maxPayloadBytes); ferr != nil {
		return task.NewTask{}, ferr
	}
	return nt, nil
}

// newTask validates one create request; prefix is the batch position of
// the request ("" for a single one).
func (s *Server) newTask(req CreateRequest, prefix string) (task.NewTask, *inputError) {
	nt, ferr := req.Validate(s.maxBytes)
	if ferr == nil {
		return nt, nil
	}
	field := ferr.Field
	if prefix != "" {
		field = prefix + "." + field
	}
	code := http.StatusBadRequest
	if ferr.TooLarge {
		code = http.StatusRequestEntityTooLarge
	}
	return task.NewTask{}, &inputError{code: code, field: field, msg: ferr.Msg}
}

func (s *Server) listTasks(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for name := range q {
		switch name {
		case "status", "kind", "limit", "cursor":
		default:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q (use status, kind, limit, cursor)", name), name)
			return
		}
	}
	p := task.ListParams{Kind: q.Get("kind"), Cursor: q.Get("cursor")}
	if ferr := p.SetStatus(q.Get("status")); ferr != nil {
		writeError(w, http.StatusBadRequest, ferr.Msg, ferr.Field)
		return
	}
	if v := q.Get("limit"); v != "" {
		n, ferr := task.ListLimitRange.Parse(v)
		if ferr != nil {
			writeError(w, http.StatusBadRequest, ferr.Msg, ferr.Field)
			return
		}
		p.Limit = int(n)
	}
	tasks, next, err := s.store.List(r.Context(), p)
	if err != nil {
		// The store names the bad filter (kind, cursor).
		s.storeError(w, r, err, "")
		return
	}
	if tasks == nil {
		tasks = []task.Task{}
	}
	writeJSON(w, http.StatusOK, ListResponse{Tasks: tasks, NextCursor: next})
}

func (s *Server) getTask(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	if !s.awaitTask(w, r, id) {
		return
	}
	t, recs, err := s.store.GetWithTransitions(r.Context(), id)
	if err != nil {
		s.storeError(w, r, err, "id")
		return
	}
	if recs == nil {
		recs = []transition.Record{}
	}
	up, down, err := s.store.Dependencies(r.Context(), id, 0)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, TaskResponse{Task: t, Result: t.Result, Progress: t.Progress, Transitions: recs, DependsOn: up, Dependents: down})
}

func (s *Server) redriveTask(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var req RedriveRequest // an empty body: the task alone
	if ierr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req, ""); ierr != nil && ierr.msg != emptyBodyMsg {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	var redriver dlq.Redriver = s.store
	withDeps := &task.DependentsRedriver{Store: s.store}
	if req.WithDependents {
		redriver = withDeps
	}
	res, removed, err := dlq.Redrive(r.Context(), s.cfg.DLQClient, s.dlqKey(), redriver, s.cfg.Actor, id)
	if err != nil {
		if rerr := (*dlq.RemoveError)(nil); errors.As(err, &rerr) {
			// The task is QUEUED again; only its old DLQ entry stayed.
			s.log.WarnContext(r.Context(), "redrive: DLQ entry not removed", "task_id", id, "err", err)
		} else {
			s.storeError(w, r, err, "id")
			return
		}
	}
	switch rr := res[0]; {
	case rr.Applied:
		writeJSON(w, http.StatusOK, RedriveResponse{ID: id, Status: rr.Status, DLQRemoved: removed, Revived: withDeps.Revived})
	case rr.Status == "":
		writeError(w, http.StatusNotFound, fmt.Sprintf("task %s not found", id), "id")
	default:
		writeError(w, http.StatusConflict, fmt.Sprintf("task %s is %s; only DEAD and CANCELLED tasks can be redriven", id, rr.Status), "id")
	}
}

// bulkRedrive answers POST /v1/tasks/redrive: it redrives the DEAD or
// CANCELLED tasks the filter selects, paced (task.DefaultRedriveRate), and
// removes their DLQ entries; with dry_run it only reports what it would
// redrive. 200 with dlq.BulkRedriveResult; 400 naming a bad field.
func (s *Server) bulkRedrive(w http.ResponseWriter, r *http.Request) {
	var req BulkRedriveRequest
	if ierr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req, ""); ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	f, ierr := req.filter()
	if ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	res, err := dlq.RedriveMatching(r.Context(), s.cfg.DLQClient, s.dlqKey(), s.store, s.cfg.Actor, f, task.RedriveOptions{DryRun: req.DryRun})
	if err != nil {
		s.internalError(w, r, fmt.Errorf("bulk redrive (%d of %d matched tasks redriven): %w", res.Redriven, res.Matched, err))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// dlqKey is the DLQ stream whose entries a redrive removes: none without
// a Redis client (Kafka mode, whose DLQ topic keeps its records).
func (s *Server) dlqKey() string {
	if s.cfg.DLQClient == nil {
		return ""
	}
	return s.cfg.DLQKey
}

// cancelTask answers POST /v1/tasks/{id}/cancel: 200 with the task once it
// is CANCELLED (it was waiting, or its lease had expired), 202 with the
// RUNNING task whose handler is being cancelled (it ends CANCELLED when the
// handler returns; GET the task to follow it), 409 for a terminal task, 404
// for an unknown one. The body {"reason": "..."} is optional.
func (s *Server) cancelTask(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var req CancelRequest // an empty body: no reason
	if ierr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req, ""); ierr != nil && ierr.msg != emptyBodyMsg {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	res, err := s.store.Cancel(r.Context(), s.cfg.Actor, req.Reason, id)
	if err != nil {
		s.storeError(w, r, err, "id")
		return
	}
	switch res.Outcome {
	case task.CancelDone:
		writeJSON(w, http.StatusOK, res.Task)
	case task.CancelRequested:
		writeJSON(w, http.StatusAccepted, res.Task)
	default:
		writeError(w, http.StatusConflict, fmt.Sprintf("task %s is %s; only QUEUED, RETRYING and RUNNING tasks can be cancelled", id, res.Task.Status), "id")
	}
}

// deleteTask answers DELETE /v1/tasks/{id}: 204 once a terminal task
// (SUCCEEDED, DEAD or CANCELLED) is deleted with its audit rows, its
// outbox rows and its DLQ entries; 409 for a live task, 404 for an unknown
// one. Each deletion is logged with the actor and counted
// (ingest_task_deleted_total).
func (s *Server) deleteTask(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	res, removed, err := dlq.Delete(r.Context(), s.cfg.DLQClient, s.dlqKey(), s.store, id)
	rerr := (*dlq.RemoveError)(nil)
	switch {
	case err != nil && !errors.As(err, &rerr):
		s.storeError(w, r, err, "id")
		return
	case len(res) == 0:
		s.storeError(w, r, fmt.Errorf("delete task %s: %w", id, task.ErrNotFound), "id")
		return
	case !res[0].Deleted:
		writeError(w, http.StatusConflict, res[0].Refusal(), "id")
		return
	}
	s.deleted.Inc()
	if rerr != nil {
		// The task is gone; an entry of it stayed in Redis (a DLQ
		// entry: dlq discard removes it).
		s.log.WarnContext(r.Context(), "delete: entries not removed from Redis", "task_id", id, "err", err)
	}
	s.log.InfoContext(r.Context(), "task deleted", "task_id", id, "status", res[0].Status, "actor", s.cfg.Actor, "dlq_removed", removed)
	w.WriteHeader(http.StatusNoContent)
}

// RunNowResponse answers POST /v1/tasks/{id}/run.
type RunNowResponse struct {
	ID     uuid.UUID  `json:"id"`
	Status task.State `json:"status"`
	// WasDueAt is when the task was due before the call.
	WasDueAt *time.Time `json:"was_due_at,omitempty"`
}

// runTaskNow answers POST /v1/tasks/{id}/run: 200 once a QUEUED or
// RETRYING task that waited for a future time is due now (and on its way
// to a worker); 409 for any other task (running, finished, already due,
// or parked by its kind's pause or limits, which run-now does not
// override); 404 for an unknown one.
func (s *Server) runTaskNow(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	res, err := s.store.RunNow(r.Context(), s.cfg.Actor, id)
	if err != nil {
		s.storeError(w, r, err, "id")
		return
	}
	if msg := res.Refusal(id); msg != "" {
		writeError(w, http.StatusConflict, msg, "id")
		return
	}
	writeJSON(w, http.StatusOK, RunNowResponse{ID: id, Status: res.Status, WasDueAt: res.NextRetryAt})
}

func pathID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	v := r.PathValue("id")
	id, err := uuid.Parse(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("id %q is not a UUID", v), "id")
		return uuid.UUID{}, false
	}
	return id, true
}

// storeError answers an error of the task store; field names the input an
// ErrInvalidTask or ErrNotFound refers to, unless the error is a
// task.FieldError, which names its own.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, err error, field string) {
	if ferr := (*task.FieldError)(nil); errors.As(err, &ferr) {
		field = ferr.Field
	}
	switch {
	case errors.Is(err, task.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error(), field)
	case errors.Is(err, task.ErrPayloadTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error(), "payload")
	case errors.Is(err, task.ErrInvalidTask):
		writeError(w, http.StatusBadRequest, err.Error(), field)
	default:
		s.internalError(w, r, err)
	}
}

// decodeJSON reads r's body (at most limit bytes) into dst: one JSON value,
// no unknown fields.
func decodeJSON(w http.ResponseWriter, r *http.Request, limit int64, dst any, prefix string) *inputError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &inputError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the request body is larger than %d bytes", limit)}
		}
		return badInput("", "reading the request body: %v", err)
	}
	return decodeStrict(body, dst, prefix)
}

// emptyBodyMsg answers a request whose body is empty or only space.
const emptyBodyMsg = "the request body is empty (want JSON)"

func decodeStrict(body []byte, dst any, prefix string) *inputError {
	field := func(name string) string {
		if prefix == "" || name == "" {
			return prefix + name
		}
		return prefix + "." + name
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badInput(prefix, emptyBodyMsg)
	}
	if !utf8.Valid(body) {
		// JSON is UTF-8 (RFC 8259); decoding would turn the bad bytes
		// into U+FFFD and store something the client did not send.
		return badInput(prefix, "the body is not valid UTF-8 (byte %d)", invalidUTF8At(body))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(dst)
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case err == nil:
		if _, err := dec.Token(); err != io.EOF {
			return badInput(prefix, "malformed JSON: more than one value in the body")
		}
		return nil
	case errors.As(err, &syntax):
		return badInput(prefix, "malformed JSON at byte %d: %v", syntax.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badInput(prefix, "malformed JSON: unexpected end of the body")
	case errors.As(err, &typ):
		if typ.Field == "" {
			return badInput(prefix, "%s must be a JSON %s, got %s", nonEmpty(prefix, "the body"), jsonType(dst), typ.Value)
		}
		if r, ok := rangeOf(dst, typ.Field); ok {
			// A fraction, an exponent or a number beyond int64.
			return badInput(field(typ.Field), "%s must be a whole number %s, got %s", typ.Field, r.Text(), typ.Value)
		}
		return badInput(field(typ.Field), "%s must be a JSON %s, got %s", typ.Field, goKindName(typ.Type.Kind()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		return badInput(field(name), "unknown field %q", name)
	}
	return badInput(prefix, "malformed JSON: %v", err)
}

// ranged is a request with whole-number fields, each of a task.Range.
type ranged interface{ ranges() []task.Range }

func (*CreateRequest) ranges() []task.Range {
	return []task.Range{task.MaxAttemptsRange, task.DelayRange, task.TimeoutRange}
}

func (*BulkRedriveRequest) ranges() []task.Range { return []task.Range{task.RedriveLimitRange} }

func (*KindRequest) ranges() []task.Range { return []task.Range{task.ConcurrencyRange} }

// rangeOf returns the range of dst's whole-number field name.
func rangeOf(dst any, name string) (task.Range, bool) {
	if r, ok := dst.(ranged); ok {
		for _, rg := range r.ranges() {
			if rg.Field == name {
				return rg, true
			}
		}
	}
	return task.Range{}, false
}

// invalidUTF8At returns the offset of the first byte of b that is not part
// of valid UTF-8.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}

func goKindName(k reflect.Kind) string {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return k.String()
}

func jsonType(v any) string {
	switch v.(type) {
	case *[]json.RawMessage:
		return "array"
	default:
		return "object"
	}
}

func nonEmpty(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}
