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
	"github.com/redis/go-redis/v9"

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

// TestHeldTaskIgnoresItsStreamEntry: a stream entry of a held task (a
// stray one: a held task has no due outbox row) is acknowledged without
// running it; the task runs once, after its dependency ends.
func TestHeldTaskIgnoresItsStreamEntry(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	ctx := context.Background()
	var mu sync.Mutex
	runs := 0
	svc.HandleResult("after", func(context.Context, ingest.Task) (json.RawMessage, error) {
		mu.Lock()
		defer mu.Unlock()
		runs++
		return nil, nil
	})
	// The dependency waits an hour: no worker starts it.
	dep, err := b.store.Create(ctx, task.NewTask{Kind: "before", Payload: json.RawMessage(`{}`), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	held, err := b.store.Create(ctx, task.NewTask{Kind: "after", Payload: json.RawMessage(`{}`), DependsOn: []uuid.UUID{dep.Task.ID}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"task_id", held.Task.ID.String(), "kind", "after"}}).Err(); err != nil {
		t.Fatal(err)
	}
	b.eventually(30*time.Second, "the stray entry read and acknowledged", func() bool {
		groups, err := b.rdb.XInfoGroups(ctx, b.stream).Result()
		return err == nil && len(groups) == 1 && groups[0].Pending == 0 && groups[0].Lag == 0 && groups[0].EntriesRead >= 1
	})
	got, err := b.store.Get(ctx, held.Task.ID)
	mu.Lock()
	n := runs
	mu.Unlock()
	if err != nil || got.Status != task.Queued || got.WaitingFor != 1 || n != 0 {
		t.Fatalf("after its stray entry the held task is %s waiting %d, ran %d times (%v)", got.Status, got.WaitingFor, n, err)
	}
	// The dependency is made due and runs: then the task runs, once.
	svc.HandleResult("before", func(context.Context, ingest.Task) (json.RawMessage, error) { return nil, nil })
	if rs, err := b.store.RunNow(ctx, "op", dep.Task.ID); err != nil || rs.Outcome != task.RunNowDone {
		t.Fatalf("RunNow = %+v, %v", rs, err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if got, err := svc.Wait(wctx, held.Task.ID); err != nil || got.Status != task.Succeeded {
		t.Fatalf("held task: %s, %v; want SUCCEEDED", got.Status, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 {
		t.Fatalf("held task ran %d times, want once", runs)
	}
}
