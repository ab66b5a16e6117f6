package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	ingest "github.com/ingest-worker/ingest"
)

// The kinds of the pipeline scenario: a document is fetched (pipe.doc),
// split into chunks that each wait for it (pipe.chunk), and joined by a
// task that waits for every chunk (pipe.join). Each records its execution
// in chaos_effect like ok, and returns a result its dependents check:
//
//   - pipe.doc   {"ms", "doc"}: returns {"doc": doc};
//   - pipe.chunk {"ms", "doc", "i"}: needs exactly its document's result
//     among its dependencies' results; returns {"doc": doc, "i": i};
//   - pipe.join  {"ms", "doc", "chunks"}: needs the results of exactly
//     "chunks" chunks of its document, i = 0..chunks-1 each once; returns
//     {"doc": doc, "chunks": chunks, "sum": the sum of their i}.
//
// A dependency result that is missing, null or of another document is a
// permanent failure: the task ends DEAD and the suite counts it lost.
type pipePayload struct {
	MS     int `json:"ms"`
	Doc    int `json:"doc"`
	I      int `json:"i"`
	Chunks int `json:"chunks"`
}

// pipeResult is what the pipeline's tasks return.
type pipeResult struct {
	Doc    int  `json:"doc"`
	I      *int `json:"i,omitempty"`
	Chunks int  `json:"chunks,omitempty"`
	Sum    int  `json:"sum,omitempty"`
}

func (h *handlers) registerPipeline(svc *ingest.Service) {
	svc.HandleResult("pipe.doc", ingest.Returning(h.pipeDoc))
	svc.HandleResult("pipe.chunk", ingest.Returning(h.pipeChunk))
	svc.HandleResult("pipe.join", ingest.Returning(h.pipeJoin))
}

// pipeRun sleeps the payload's "ms" and records the execution.
func (h *handlers) pipeRun(ctx context.Context, t ingest.Task) (pipePayload, error) {
	var p pipePayload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return p, ingest.Permanent(err)
	}
	if p.MS > 0 {
		if err := sleep(ctx, time.Duration(p.MS)*time.Millisecond); err != nil {
			return p, err
		}
	}
	return p, h.record(ctx, t)
}

// dependencyResults decodes every dependency's result; null or missing is
// an error.
func dependencyResults(t ingest.Task) ([]pipeResult, error) {
	var out []pipeResult
	for id, raw := range t.Dependencies {
		var r pipeResult
		if len(raw) == 0 || string(raw) == "null" {
			return nil, fmt.Errorf("dependency %s: no result", id)
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("dependency %s: result %s: %w", id, raw, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func (h *handlers) pipeDoc(ctx context.Context, t ingest.Task) (pipeResult, error) {
	p, err := h.pipeRun(ctx, t)
	if err != nil {
		return pipeResult{}, err
	}
	return pipeResult{Doc: p.Doc}, nil
}

func (h *handlers) pipeChunk(ctx context.Context, t ingest.Task) (pipeResult, error) {
	rs, err := dependencyResults(t)
	if err == nil && (len(rs) != 1 || rs[0].I != nil) {
		err = fmt.Errorf("want its document's result alone, got %d results: %+v", len(rs), rs)
	}
	if err != nil {
		return pipeResult{}, ingest.Permanent(err)
	}
	p, err := h.pipeRun(ctx, t)
	if err != nil {
		return pipeResult{}, err
	}
	if rs[0].Doc != p.Doc {
		return pipeResult{}, ingest.Permanent(fmt.Errorf("the document's result is of document %d, want %d", rs[0].Doc, p.Doc))
	}
	return pipeResult{Doc: p.Doc, I: &p.I}, nil
}

func (h *handlers) pipeJoin(ctx context.Context, t ingest.Task) (pipeResult, error) {
	rs, err := dependencyResults(t)
	if err != nil {
		return pipeResult{}, ingest.Permanent(err)
	}
	p, err := h.pipeRun(ctx, t)
	if err != nil {
		return pipeResult{}, err
	}
	seen := map[int]bool{}
	sum := 0
	for _, r := range rs {
		if r.Doc != p.Doc || r.I == nil || *r.I < 0 || *r.I >= p.Chunks || seen[*r.I] {
			return pipeResult{}, ingest.Permanent(fmt.Errorf("a chunk's result %+v does not belong to document %d's %d chunks", r, p.Doc, p.Chunks))
		}
		seen[*r.I] = true
		sum += *r.I
	}
	if len(rs) != p.Chunks {
		return pipeResult{}, ingest.Permanent(fmt.Errorf("got the results of %d chunks, want %d", len(rs), p.Chunks))
	}
	return pipeResult{Doc: p.Doc, Chunks: len(rs), Sum: sum}, nil
}
