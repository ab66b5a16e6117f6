package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/ingest-worker/ingest/task"
)

// KindsResponse answers GET /v1/kinds.
type KindsResponse struct {
	Kinds []task.KindInfo `json:"kinds"`
}

// KindRequest is the body of PUT /v1/kinds/{kind}. Only paused is
// supported: concurrency and rate limits are refused.
type KindRequest struct {
	Paused      *bool           `json:"paused"`
	Concurrency json.RawMessage `json:"concurrency,omitempty"`
	Rate        json.RawMessage `json:"rate,omitempty"`
}

// KindResponse answers PUT /v1/kinds/{kind}: the kind after the change
// and, for a resume, how many parked tasks it released.
type KindResponse struct {
	task.KindInfo
	Released int `json:"released"`
}

// listKinds answers GET /v1/kinds: every kind with tasks or settings, its
// settings, its tasks by status, running and parked.
func (s *Server) listKinds(w http.ResponseWriter, r *http.Request) {
	kinds, err := s.store.Kinds(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if kinds == nil {
		kinds = []task.KindInfo{}
	}
	writeJSON(w, http.StatusOK, KindsResponse{Kinds: kinds})
}

// putKind answers PUT /v1/kinds/{kind} {"paused": bool}: 200 with the
// kind; 400 naming a bad field.
func (s *Server) putKind(w http.ResponseWriter, r *http.Request) {
	kind := r.PathValue("kind")
	var req KindRequest
	if ierr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req, ""); ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	switch {
	case len(req.Concurrency) > 0 && string(req.Concurrency) != "0" && string(req.Concurrency) != "null":
		writeError(w, http.StatusBadRequest, "concurrency limits are not supported by this version (0 or absent only)", "concurrency")
		return
	case len(req.Rate) > 0 && string(req.Rate) != `"0"` && string(req.Rate) != `""` && string(req.Rate) != "null":
		writeError(w, http.StatusBadRequest, "rate limits are not supported by this version (\"0\" or absent only)", "rate")
		return
	case req.Paused == nil:
		writeError(w, http.StatusBadRequest, "paused is required (true or false)", "paused")
		return
	}
	released, err := s.store.SetPaused(r.Context(), s.cfg.Actor, kind, *req.Paused)
	if err != nil {
		var ferr *task.FieldError
		if errors.As(err, &ferr) {
			writeError(w, http.StatusBadRequest, ferr.Msg, ferr.Field)
			return
		}
		s.internalError(w, r, err)
		return
	}
	k, ok, err := s.store.Kind(r.Context(), kind)
	if err == nil && !ok {
		err = fmt.Errorf("kind %q not listed after its change", kind)
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, KindResponse{KindInfo: k, Released: released})
}
