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
	nts := groupTasks(kind, "burst", burst)
	for g := range quiet {
		nts = append(nts, groupTasks(kind, fmt.Sprintf("quiet-%d", g), perQuiet)...)
	}
	w := window
	runs := kb.workGroups(kind, task.KindUpdate{GroupWindow: &w}, nts)
	runs.check(t, window, len(nts))
	starts, most := runs.starts, runs.most
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

// TestKafkaConcurrencyPerGroup: a kind's concurrency_per_group holds in
// Kafka mode: three groups of 5 tasks, 1 at a time per group, on a worker
// of 8 slots.
func TestKafkaConcurrencyPerGroup(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 2, task.Config{})
	const kind, perGroup, groups, each = "kc", 1, 3, 5
	var nts []task.NewTask
	for g := range groups {
		nts = append(nts, groupTasks(kind, fmt.Sprintf("g%d", g), each)...)
	}
	c := perGroup
	runs := kb.workGroups(kind, task.KindUpdate{ConcurrencyPerGroup: &c}, nts)
	runs.check(t, perGroup, len(nts))
	t.Logf("most at once per group: %v", runs.most)
}

// groupTasks returns n new tasks of kind in group.
func groupTasks(kind, group string, n int) []task.NewTask {
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, GroupKey: group, Payload: json.RawMessage(`{}`)}
	}
	return nts
}

// workGroups sets kind's settings to update, creates nts (of kind) and
// works them on a worker of 8 slots whose handler is the groupRuns it
// returns, with a relay, until every task SUCCEEDED.
func (kb *kbundle) workGroups(kind string, update task.KindUpdate, nts []task.NewTask) *groupRuns {
	kb.t.Helper()
	if _, err := kb.store.SetKind(kb.ctx, "test", kind, update); err != nil {
		kb.t.Fatal(err)
	}
	runs := newGroupRuns(20 * time.Millisecond)
	wk, _ := kb.worker(ingest.Config{Concurrency: 8}, map[string]ingest.Handler{kind: runs.handle})
	if _, err := kb.store.CreateBatch(kb.ctx, nts); err != nil {
		kb.t.Fatal(err)
	}
	kb.relay()
	kb.run(wk)
	testenv.Eventually(kb.t, 60*time.Second, "every task SUCCEEDED", func() bool { return kb.countStatus(task.Succeeded) == len(nts) })
	return runs
}

// groupRuns is a handler that works for a fixed time and records, by
// group, the most runs at once and the order of the starts.
type groupRuns struct {
	work    time.Duration
	mu      sync.Mutex
	running map[string]int
	most    map[string]int
	starts  []string // the group of each start, in order
}

func newGroupRuns(work time.Duration) *groupRuns {
	return &groupRuns{work: work, running: map[string]int{}, most: map[string]int{}}
}

func (r *groupRuns) handle(_ context.Context, tk ingest.Task) error {
	r.mu.Lock()
	r.running[tk.GroupKey]++
	r.most[tk.GroupKey] = max(r.most[tk.GroupKey], r.running[tk.GroupKey])
	r.starts = append(r.starts, tk.GroupKey)
	r.mu.Unlock()
	time.Sleep(r.work) // the work
	r.mu.Lock()
	r.running[tk.GroupKey]--
	r.mu.Unlock()
	return nil
}

// check fails t when a group ran more than limit at once, or the runs
// started were not n (once each: every task ran once).
func (r *groupRuns) check(t *testing.T, limit, n int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for g, m := range r.most {
		if m > limit {
			t.Errorf("group %s ran %d tasks at once, want at most %d", g, m, limit)
		}
	}
	if len(r.starts) != n {
		t.Fatalf("%d starts, want %d", len(r.starts), n)
	}
}
