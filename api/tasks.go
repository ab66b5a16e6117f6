package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

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
	Transitions []transition.Record `json:"transitions"`
}

// RedriveResponse answers POST /v1/tasks/{id}/redrive.
type RedriveResponse struct {
	ID     uuid.UUID  `json:"id"`
	Status task.State `json:"status"`
	// DLQRemoved counts the DLQ entries of the task removed (those of its
	// last death; 0 without a DLQ or when their removal failed, which the
	// server logs).
	DLQRemoved int `json:"dlq_removed"`
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
	res, err := s.store.CreateBatch(tracing.ExtractHeader(r.Context(), r.Header), nts)
	if err != nil {
		s.storeError(w, r, err, "")
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
	switch {
	case len(req.Payload) == 0 || string(req.Payload) == "null":
		return task.NewTask{}, &FieldError{Field: "payload", Msg: "payload is required (any JSON value but null)"}
	case req.MaxAttempts != nil && *req.MaxAttempts < 1:
		return task.NewTask{}, &FieldError{Field: "max_attempts", Msg: fmt.Sprintf("max_attempts must be >= 1, got %d", *req.MaxAttempts)}
	}
	nt := task.NewTask{Kind: strings.TrimSpace(req.Kind), Payload: req.Payload, IdempotencyKey: req.IdempotencyKey}
	if req.RunAt != "" {
		at, err := time.Parse(time.RFC3339Nano, req.RunAt)
		if err != nil {
			return task.NewTask{}, &FieldError{Field: "run_at", Msg: fmt.Sprintf("run_at %q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", req.RunAt)}
		}
		nt.RunAt = at
	}
	var ok bool
	if nt.Delay, ok = millis(req.DelayMS); !ok {
		return task.NewTask{}, &FieldError{Field: "delay_ms", Msg: fmt.Sprintf("delay_ms %d is out of range", req.DelayMS)}
	}
	if nt.Timeout, ok = millis(req.TimeoutMS); !ok {
		return task.NewTask{}, &FieldError{Field: "timeout_ms", Msg: fmt.Sprintf("timeout_ms %d is out of range", req.TimeoutMS)}
	}
	if req.MaxAttempts != nil {
		nt.MaxAttempts = *req.MaxAttempts
	}
	if ferr := nt.Validate(maxPayloadBytes); ferr != nil {
		return task.NewTask{}, ferr
	}
	return nt, nil
}

// millis converts a count of milliseconds to a duration, reporting false
// when it does not fit (negative values are left to task.NewTask.Validate).
func millis(ms int64) (time.Duration, bool) {
	if ms > int64(math.MaxInt64/time.Millisecond) || ms < int64(math.MinInt64/time.Millisecond) {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
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
	if v := q.Get("status"); v != "" {
		p.Status = task.State(strings.ToUpper(v))
		if !p.Status.Valid() {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("status %q is not one of %v", v, task.States), "status")
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > task.MaxListLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be a whole number from 1 to %d, got %q", task.MaxListLimit, v), "limit")
			return
		}
		p.Limit = n
	}
	tasks, next, err := s.store.List(r.Context(), p)
	if err != nil {
		// Everything else was checked above: an invalid task here is the cursor.
		s.storeError(w, r, err, "cursor")
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
	t, recs, err := s.store.GetWithTransitions(r.Context(), id)
	if err != nil {
		s.storeError(w, r, err, "id")
		return
	}
	if recs == nil {
		recs = []transition.Record{}
	}
	writeJSON(w, http.StatusOK, TaskResponse{Task: t, Transitions: recs})
}

func (s *Server) redriveTask(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	res, removed, err := dlq.Redrive(r.Context(), s.cfg.DLQClient, s.dlqKey(), s.store, s.cfg.Actor, id)
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
		writeJSON(w, http.StatusOK, RedriveResponse{ID: id, Status: rr.Status, DLQRemoved: removed})
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
	if len(req.Reason) > task.MaxCancelReasonBytes {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reason is %d bytes, the limit is %d", len(req.Reason), task.MaxCancelReasonBytes), "reason")
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
// ErrInvalidTask or ErrNotFound refers to.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, err error, field string) {
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
		return badInput(field(typ.Field), "%s must be a JSON %s, got %s", typ.Field, goKindName(typ.Type.Kind()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		return badInput(field(name), "unknown field %q", name)
	}
	return badInput(prefix, "malformed JSON: %v", err)
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
