package api

import (
	"fmt"
	"net/http"

	"github.com/ingest-worker/ingest/task"
)

// BlockedSequencesResponse answers GET /v1/sequences/blocked.
type BlockedSequencesResponse struct {
	Sequences []task.BlockedSequence `json:"sequences"`
}

// listBlockedSequences answers GET /v1/sequences/blocked?kind=&limit=:
// the sequences held by a DEAD task (task.Store.BlockedSequences), by
// kind and key; 400 naming a bad parameter.
func (s *Server) listBlockedSequences(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for name := range q {
		if name != "kind" && name != "limit" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown query parameter %q (use kind, limit)", name), name)
			return
		}
	}
	kind := q.Get("kind")
	if kind != "" {
		if ferr := task.CheckName("kind", kind, task.MaxKindLength); ferr != nil {
			writeError(w, http.StatusBadRequest, ferr.Msg, ferr.Field)
			return
		}
	}
	limit := int64(100)
	if v := q.Get("limit"); v != "" {
		n, ferr := task.ListLimitRange.Parse(v)
		if ferr != nil {
			writeError(w, http.StatusBadRequest, ferr.Msg, ferr.Field)
			return
		}
		limit = n
	}
	seqs, err := s.store.BlockedSequences(r.Context(), kind, int(limit))
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if seqs == nil {
		seqs = []task.BlockedSequence{}
	}
	writeJSON(w, http.StatusOK, BlockedSequencesResponse{Sequences: seqs})
}
