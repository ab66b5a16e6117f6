package task_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestRowsOfABatchAreTheirOwn: the statements that read many tasks at
// once (a start, a repeat of idempotency keys) read every row through one
// set of destinations; each task they return keeps its own id, payload
// and fields, whatever rows came after it.
func TestRowsOfABatchAreTheirOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	const n = 40
	nts := make([]task.NewTask, n)
	for i := range nts {
		// Payloads of different lengths, longest first, so that a row
		// read into the bytes of the row before would show it.
		nts[i] = task.NewTask{Kind: "scan", IdempotencyKey: fmt.Sprintf("key-%d", i), MaxAttempts: i + 1,
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d,"s":%q}`, i, strings.Repeat("x", n-i)))}
	}
	created, err := b.store.CreateBatch(b.ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	want := map[uuid.UUID]int{}
	ids := make([]uuid.UUID, n)
	for i, r := range created {
		ids[i] = r.Task.ID
		want[r.Task.ID] = i
	}
	check := func(what string, id uuid.UUID, tk *task.Task) {
		t.Helper()
		i, ok := want[id]
		if !ok || tk.ID != id {
			t.Fatalf("%s: task %s (row %s) is none of those created", what, tk.ID, id)
		}
		var p struct {
			N int    `json:"n"`
			S string `json:"s"`
		}
		if err := json.Unmarshal(tk.Payload, &p); err != nil || p.N != i || p.S != strings.Repeat("x", n-i) {
			t.Errorf("%s: task %d read payload %s (%v), want %s", what, i, tk.Payload, err, nts[i].Payload)
		}
		if tk.IdempotencyKey != nts[i].IdempotencyKey || tk.MaxAttempts == nil || *tk.MaxAttempts != nts[i].MaxAttempts {
			t.Errorf("%s: task %d read key %q, max attempts %v; want %q, %d", what, i, tk.IdempotencyKey, tk.MaxAttempts,
				nts[i].IdempotencyKey, nts[i].MaxAttempts)
		}
	}

	again, err := b.store.CreateBatch(b.ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again {
		if !r.Existing || r.Task.ID != ids[i] {
			t.Fatalf("repeat %d: existing %v, id %s; want the task created first, %s", i, r.Existing, r.Task.ID, ids[i])
		}
		check("repeat", ids[i], &r.Task)
	}

	started, err := b.store.Start(b.ctx, "w", time.Minute, ids...)
	if err != nil {
		t.Fatal(err)
	}
	if len(started) != n {
		t.Fatalf("Start returned %d results, want %d", len(started), n)
	}
	seen := map[uuid.UUID]bool{}
	for _, r := range started {
		if r.Task == nil || seen[r.ID] {
			t.Fatalf("Start: result %+v is missing its task or repeats one", r)
		}
		seen[r.ID] = true
		check("start", r.ID, r.Task)
		if r.Task.Status != task.Running {
			t.Errorf("start: task %s is %s, want RUNNING", r.ID, r.Task.Status)
		}
	}
}
