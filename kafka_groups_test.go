package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestKafkaGroupWindowHoldsABurst: the group window holds in Kafka mode
// as in Redis mode (it is kept in PostgreSQL, whatever carries the
// tasks). A group's burst of 30 tasks created first, then three quiet
// groups of 3, window 2, one worker of 8 slots: no group ever runs more
// than its window at once, and the quiet groups' tasks all start before
// the burst is half through; first in, first out they would start after
// it.
func TestKafkaGroupWindowHoldsABurst(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 2, task.Config{})
	const kind, window, burst, quiet, perQuiet = "kg", 2, 30, 3, 3
	w := window
	if _, err := kb.store.SetKind(kb.ctx, "test", kind, task.KindUpdate{GroupWindow: &w}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	running := map[string]int{}
	most := map[string]int{}
	var starts []string // the group of each start, in order
	handler := func(_ context.Context, tk ingest.Task) error {
		mu.Lock()
		running[tk.GroupKey]++
		most[tk.GroupKey] = max(most[tk.GroupKey], running[tk.GroupKey])
		starts = append(starts, tk.GroupKey)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond) // the work
		mu.Lock()
		running[tk.GroupKey]--
		mu.Unlock()
		return nil
	}
	wk, _ := kb.worker(ingest.Config{Concurrency: 8}, map[string]ingest.Handler{kind: handler})

	var nts []task.NewTask
	for range burst {
		nts = append(nts, task.NewTask{Kind: kind, GroupKey: "burst", Payload: json.RawMessage(`{}`)})
	}
	for g := range quiet {
		for range perQuiet {
			nts = append(nts, task.NewTask{Kind: kind, GroupKey: fmt.Sprintf("quiet-%d", g), Payload: json.RawMessage(`{}`)})
		}
	}
	if _, err := kb.store.CreateBatch(kb.ctx, nts); err != nil {
		t.Fatal(err)
	}
	kb.relay()
	kb.run(wk)
	testenv.Eventually(t, 60*time.Second, "every task SUCCEEDED", func() bool { return kb.countStatus(task.Succeeded) == len(nts) })

	mu.Lock()
	defer mu.Unlock()
	for g, n := range most {
		if n > window {
			t.Errorf("group %s ran %d tasks at once, window %d", g, n, window)
		}
	}
	if len(starts) != len(nts) {
		t.Fatalf("%d starts, want %d", len(starts), len(nts))
	}
	burstBefore, lastQuiet := 0, -1
	for i, g := range starts {
		if g != "burst" {
			lastQuiet = i
		}
	}
	for _, g := range starts[:lastQuiet+1] {
		if g == "burst" {
			burstBefore++
		}
	}
	if burstBefore > burst/2 {
		t.Errorf("%d burst tasks started before the last quiet one (starts %v), want at most %d", burstBefore, starts, burst/2)
	}
	t.Logf("burst tasks started before the last quiet one: %d of %d; most at once per group: %v", burstBefore, burst, most)
}
