package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	ingest "github.com/ingest-worker/ingest"
)

// embedAll stands in for one call to an embedding API for many texts.
func embedAll(ctx context.Context, texts []string) ([][]float32, error) {
	return make([][]float32, len(texts)), ctx.Err()
}

// A batch handler: up to 64 chunks of a document in one call to an
// embedding API, an outcome per chunk. Each chunk keeps its own attempts,
// retries and DLQ path. (Compiled, not run: it needs servers.)
func ExampleService_HandleBatch() {
	var svc *ingest.Service // from ingest.NewService
	err := svc.HandleBatch("chunk.embed", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		texts := make([]string, len(tasks))
		outs := make([]ingest.Outcome, 0, len(tasks))
		for i, t := range tasks {
			var p struct {
				Text string `json:"text"`
			}
			if err := json.Unmarshal(t.Payload, &p); err != nil || p.Text == "" {
				outs = append(outs, t.Outcome(nil, ingest.Permanent(errors.New("no text")))) // this chunk: DEAD
				continue
			}
			texts[i] = p.Text
		}
		vecs, err := embedAll(ctx, texts)
		if err != nil {
			return nil, err // every chunk of the batch: a failed attempt, retried
		}
		for i, t := range tasks {
			if texts[i] != "" {
				outs = append(outs, t.Outcome(map[string]int{"dims": len(vecs[i])}, nil)) // SUCCEEDED with a result
			}
		}
		return outs, nil
	}, ingest.BatchOptions{Max: 64, Wait: 20 * time.Millisecond})
	if err != nil {
		panic(err) // names the bad option
	}
}
