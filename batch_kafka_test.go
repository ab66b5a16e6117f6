package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestKafkaBatchHandler: in Kafka mode a batch handler gets batches of at
// most Max across partitions, each task ends by its own outcome (retries
// through the outbox, deaths in the DLQ topic) and every record is
// committed.
func TestKafkaBatchHandler(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 4, task.Config{Backoff: task.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
	w, reg := kb.worker(ingest.Config{Concurrency: 32}, nil)
	var log batchLog
	if err := w.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		log.add(tasks)
		var outs []ingest.Outcome
		for _, t := range tasks {
			res, err, omit := decide(t)
			if !omit {
				outs = append(outs, t.Outcome(res, err))
			}
		}
		return outs, nil
	}, ingest.BatchOptions{Max: 8, Wait: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	kb.relay()
	kb.run(w)
	var nts []task.NewTask
	want := map[string]task.State{"ok": task.Succeeded, "flaky": task.Succeeded, "missing": task.Succeeded, "permanent": task.Dead}
	for i := range 40 {
		m := []string{"ok", "flaky", "missing", "permanent"}[i%4]
		nts = append(nts, task.NewTask{Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"mode":%q,"n":%d}`, m, i)), MaxAttempts: 3})
	}
	res, err := kb.store.CreateBatch(kb.ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "every task ended", func() bool {
		return kb.countStatus(task.Succeeded)+kb.countStatus(task.Dead) == 40
	})
	for i, r := range res {
		var p struct{ Mode string }
		_ = json.Unmarshal(nts[i].Payload, &p)
		got := kb.task(r.Task.ID)
		if got.Status != want[p.Mode] {
			t.Errorf("%s task %s ended %s, want %s", p.Mode, got.ID, got.Status, want[p.Mode])
		}
		if p.Mode == "flaky" || p.Mode == "missing" {
			if got.AttemptCount != 1 {
				t.Errorf("%s task %s: %d failed attempts, want 1", p.Mode, got.ID, got.AttemptCount)
			}
		}
	}
	if sizes := log.sizes(); slices.Max(sizes) > 8 || slices.Max(sizes) < 2 {
		t.Errorf("batch sizes %v: want at most 8, and some batch of more than one", sizes)
	}
	testenv.Eventually(t, 10*time.Second, "group lag 0", func() bool { return kb.lag() == 0 })
	if got := len(kb.dlqRecords(10)); got != 10 {
		t.Errorf("%d records in the DLQ topic, want the 10 permanent failures", got)
	}
	awaitMetric(t, reg, "ingest_task_batch_size", map[string]string{"kind": "k"}, float64(len(log.sizes())))
}
