package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// TestFanOutFanInPipeline runs a document pipeline on a worker: a split,
// 100 chunks that depend on it, and a join that depends on every chunk,
// created in one batch. The join runs once, after all 100 chunks have
// succeeded, with their 100 results; no chunk runs before the split.
func TestFanOutFanInPipeline(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	ctx := context.Background()
	var mu sync.Mutex
	var splitDone bool
	chunksDone := 0
	joinRuns := 0
	var joinDeps map[uuid.UUID]json.RawMessage
	svc.HandleResult("split", func(context.Context, ingest.Task) (json.RawMessage, error) {
		mu.Lock()
		defer mu.Unlock()
		splitDone = true
		return json.RawMessage(`{"chunks":100}`), nil
	})
	svc.HandleResult("chunk", func(_ context.Context, tk ingest.Task) (json.RawMessage, error) {
		mu.Lock()
		defer mu.Unlock()
		if !splitDone {
			t.Errorf("chunk %s ran before the split", tk.ID)
		}
		if len(tk.Dependencies) != 1 {
			t.Errorf("chunk got %d dependency results, want the split's", len(tk.Dependencies))
		}
		chunksDone++
		var p struct{ I int }
		_ = json.Unmarshal(tk.Payload, &p)
		return json.RawMessage(fmt.Sprintf(`{"i":%d}`, p.I)), nil
	})
	svc.HandleResult("join", func(_ context.Context, tk ingest.Task) (json.RawMessage, error) {
		mu.Lock()
		defer mu.Unlock()
		joinRuns++
		if chunksDone != 100 {
			t.Errorf("join ran after %d of 100 chunks", chunksDone)
		}
		joinDeps = tk.Dependencies
		return json.RawMessage(`"indexed"`), nil
	})
	nts := []task.NewTask{{Kind: "split", Payload: json.RawMessage(`{}`), Ref: "split"}}
	refs := make([]string, 100)
	for i := range refs {
		refs[i] = fmt.Sprintf("c%d", i)
		nts = append(nts, task.NewTask{Kind: "chunk", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), Ref: refs[i], DependsOnRefs: []string{"split"}})
	}
	nts = append(nts, task.NewTask{Kind: "join", Payload: json.RawMessage(`{}`), DependsOnRefs: refs})
	res, err := b.store.CreateBatch(ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	join, err := svc.Wait(wctx, res[101].Task.ID)
	if err != nil || join.Status != task.Succeeded {
		t.Fatalf("join: %s, %v; want SUCCEEDED", join.Status, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if joinRuns != 1 || len(joinDeps) != 100 {
		t.Fatalf("join ran %d times with %d results; want once with 100", joinRuns, len(joinDeps))
	}
	for i := 1; i <= 100; i++ {
		if got, want := string(joinDeps[res[i].Task.ID]), fmt.Sprintf(`{"i": %d}`, i-1); got != want {
			t.Fatalf("result of chunk %d = %s, want %s", i-1, got, want)
		}
	}
}
