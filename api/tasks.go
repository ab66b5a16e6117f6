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

	"github.com/google/uuid"

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
	res, err := s.store.Create(r.Context(), nt)
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
	res, err := s.store.CreateBatch(r.Context(), nts)
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
type FieldError struct {
	Field string // kind, payload, idempotency_key or max_attempts
	Msg   string
	// TooLarge is set when the payload is over the size limit.
	TooLarge bool
}

func (e *FieldError) Error() string { return e.Msg }

// Validate checks a create request, with payloads limited to
// maxPayloadBytes, and returns the task to create. The HTTP API and the
// CLI's enqueue --file share it.
func (req CreateRequest) Validate(maxPayloadBytes int) (task.NewTask, *FieldError) {
	bad := func(field, format string, args ...any) (task.NewTask, *FieldError) {
		return task.NewTask{}, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	kind := strings.TrimSpace(req.Kind)
	switch {
	case kind == "":
		return bad("kind", "kind is required")
	case len(kind) > task.MaxKindLength:
		return bad("kind", "kind is longer than %d bytes", task.MaxKindLength)
	case len(req.Payload) == 0 || string(req.Payload) == "null":
		return bad("payload", "payload is required (any JSON value but null)")
	case len(req.Payload) > maxPayloadBytes:
		return task.NewTask{}, &FieldError{Field: "payload", TooLarge: true,
			Msg: fmt.Sprintf("payload is %d bytes, the limit is %d", len(req.Payload), maxPayloadBytes)}
	case len(req.IdempotencyKey) > 1000:
		return bad("idempotency_key", "idempotency_key is longer than 1000 bytes")
	case req.MaxAttempts != nil && *req.MaxAttempts < 1:
		return bad("max_attempts", "max_attempts must be >= 1, got %d", *req.MaxAttempts)
	}
	if _, err := task.Canonical(req.Payload); err != nil {
		return bad("payload", "payload %v", err)
	}
	nt := task.NewTask{Kind: kind, Payload: req.Payload, IdempotencyKey: req.IdempotencyKey}
	if req.MaxAttempts != nil {
		nt.MaxAttempts = *req.MaxAttempts
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
	res, err := s.store.Redrive(r.Context(), s.cfg.Actor, id)
	if err != nil {
		s.storeError(w, r, err, "id")
		return
	}
	switch rr := res[0]; {
	case rr.Applied:
		writeJSON(w, http.StatusOK, RedriveResponse{ID: id, Status: rr.Status})
	case rr.Status == "":
		writeError(w, http.StatusNotFound, fmt.Sprintf("task %s not found", id), "id")
	default:
		writeError(w, http.StatusConflict, fmt.Sprintf("task %s is %s; only DEAD tasks can be redriven", id, rr.Status), "id")
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

func decodeStrict(body []byte, dst any, prefix string) *inputError {
	field := func(name string) string {
		if prefix == "" || name == "" {
			return prefix + name
		}
		return prefix + "." + name
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badInput(prefix, "the request body is empty (want JSON)")
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
