package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/task"
)

// MaxWait bounds GET /v1/tasks/{id}?wait=.
const MaxWait = 60 * time.Second

// ProgressRequest is the body of POST /v1/tasks/{id}/progress: the
// attempt the worker gave the handler (attempt_count + 1 of the run), a
// percent from 0 to 100 and an optional message of at most
// task.MaxProgressMessageBytes.
type ProgressRequest struct {
	Attempt *int64 `json:"attempt"`
	Percent *int64 `json:"percent"`
	Message string `json:"message,omitempty"`
}

func (*ProgressRequest) ranges() []task.Range {
	return []task.Range{task.AttemptRange, task.ProgressPercentRange}
}

// report checks the request and returns the report of task id.
func (req ProgressRequest) report(id uuid.UUID) (task.ProgressReport, *inputError) {
	for _, f := range []struct {
		v  *int64
		rg task.Range
	}{{req.Attempt, task.AttemptRange}, {req.Percent, task.ProgressPercentRange}} {
		if f.v == nil {
			return task.ProgressReport{}, badInput(f.rg.Field, "%s is required", f.rg.Field)
		}
		if ferr := f.rg.Check(*f.v); ferr != nil {
			return task.ProgressReport{}, badInput(ferr.Field, "%s", ferr.Msg)
		}
	}
	r := task.ProgressReport{ID: id, Attempt: int(*req.Attempt), Percent: int(*req.Percent), Message: req.Message}
	if ferr := r.Check(); ferr != nil {
		return r, badInput(ferr.Field, "%s", ferr.Msg)
	}
	return r, nil
}

// setProgress answers POST /v1/tasks/{id}/progress: 204 once the progress
// of the running attempt is written; 400 naming a bad field, 404 for an
// unknown task, 409 when the task does not run that attempt (a stale
// attempt, or a task not RUNNING).
func (s *Server) setProgress(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r)
	if !ok {
		return
	}
	var req ProgressRequest
	if ierr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req, ""); ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	rep, ierr := req.report(id)
	if ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	err := s.store.SetProgress(r.Context(), rep)
	switch {
	case err == nil:
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, task.ErrStaleAttempt):
		writeError(w, http.StatusConflict, fmt.Sprintf("task %s is not running attempt %d", id, rep.Attempt), "attempt")
	default:
		s.storeError(w, r, err, "id")
	}
}

// awaitTask waits, for GET /v1/tasks/{id}?wait=D, until task id is
// terminal or D has passed (woken by the notification of its end, see
// task.Awaiter), and reports whether to go on answering the task. It
// answers 400 for a bad wait and 404 for an unknown task itself.
func (s *Server) awaitTask(w http.ResponseWriter, r *http.Request, id uuid.UUID) bool {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return true
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > MaxWait {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("wait must be a duration from 0s to %s (such as 30s), got %q", MaxWait, clip.String(v, 64)), "wait")
		return false
	}
	if d == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	defer cancel()
	_, err = s.awaiter.Wait(ctx, id)
	switch {
	case err == nil, errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		return true
	case r.Context().Err() != nil:
		return false // the client went away
	default:
		s.storeError(w, r, err, "id")
		return false
	}
}
