package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/ingest-worker/ingest/task"
)

// KindsResponse answers GET /v1/kinds.
type KindsResponse struct {
	Kinds []task.KindInfo `json:"kinds"`
}

// KindRequest is the body of PUT /v1/kinds/{kind}: the settings to
// change (absent ones are left as they are). Concurrency 0 and rate "0"
// remove a limit.
type KindRequest struct {
	Paused      *bool   `json:"paused"`
	Concurrency *int    `json:"concurrency"`
	Rate        *string `json:"rate"`
	// SequenceOnFailure is "block" or "continue".
	SequenceOnFailure *string `json:"sequence_on_failure"`
	// ConcurrencyPerGroup and RatePerGroup limit each group of the kind
	// as Concurrency and Rate limit the kind (0, "0": no limit);
	// GroupWindow is the most tasks of one group in the stream or running
	// at once (fair scheduling; 0: the default; never more than
	// ConcurrencyPerGroup when it is set).
	ConcurrencyPerGroup *int    `json:"concurrency_per_group"`
	RatePerGroup        *string `json:"rate_per_group"`
	GroupWindow         *int    `json:"group_window"`
	// GroupWeights sets the weights of the groups it names (1 to 100; 1
	// resets a group to the default); groups not named keep theirs.
	GroupWeights map[string]int `json:"group_weights"`
}

// KindResponse answers PUT /v1/kinds/{kind}: the kind after the change
// and how many parked tasks it released (a resume, a limit raised or
// removed).
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

// getKind answers GET /v1/kinds/{kind}: the kind as GET /v1/kinds lists
// it; 404 when it has neither tasks nor settings.
func (s *Server) getKind(w http.ResponseWriter, r *http.Request) {
	kind := r.PathValue("kind")
	if ferr := task.CheckName("kind", kind, task.MaxKindLength); ferr != nil {
		writeError(w, http.StatusBadRequest, ferr.Msg, ferr.Field)
		return
	}
	k, ok, err := s.store.Kind(r.Context(), kind)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("kind %q has neither tasks nor settings", kind), "kind")
		return
	}
	writeJSON(w, http.StatusOK, k)
}

// putKind answers PUT /v1/kinds/{kind} {"paused": bool, "concurrency":
// n, "rate": "5/s", "concurrency_per_group": n, "rate_per_group": "1/s",
// "group_window": n, "group_weights": {"tenant": 3}, "sequence_on_failure":
// "block"}: 200 with the kind; 400 naming a bad field.
func (s *Server) putKind(w http.ResponseWriter, r *http.Request) {
	kind := r.PathValue("kind")
	var req KindRequest
	if ierr := decodeJSON(w, r, s.cfg.MaxBodyBytes, &req, ""); ierr != nil {
		writeError(w, ierr.code, ierr.msg, ierr.field)
		return
	}
	u := task.KindUpdate{Paused: req.Paused, Concurrency: req.Concurrency, SequenceOnFailure: req.SequenceOnFailure,
		ConcurrencyPerGroup: req.ConcurrencyPerGroup, GroupWindow: req.GroupWindow, GroupWeights: req.GroupWeights}
	if req.Rate != nil {
		rate, err := task.ParseRate(*req.Rate)
		if err != nil {
			writeStoreError(w, r, s, err)
			return
		}
		u.Rate = &rate
	}
	if req.RatePerGroup != nil {
		rate, err := task.ParseGroupRate(*req.RatePerGroup)
		if err != nil {
			writeStoreError(w, r, s, err)
			return
		}
		u.RatePerGroup = &rate
	}
	released, err := s.store.SetKind(r.Context(), s.cfg.Actor, kind, u)
	if err != nil {
		writeStoreError(w, r, s, err)
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

// writeStoreError answers a store error: 400 naming the field of a
// task.FieldError, else 500.
func writeStoreError(w http.ResponseWriter, r *http.Request, s *Server, err error) {
	var ferr *task.FieldError
	if errors.As(err, &ferr) {
		writeError(w, http.StatusBadRequest, ferr.Msg, ferr.Field)
		return
	}
	s.internalError(w, r, err)
}
