package maintenance_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// TestSequencesBlockedGauge: ingest_sequences_blocked counts the sequence
// keys of each kind held by a DEAD task, and drops to 0 once the DEAD
// task is deleted.
func TestSequencesBlockedGauge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	c, err := maintenance.NewSequenceCounter(time.Minute, store, reg)
	if err != nil {
		t.Fatal(err)
	}
	var heads []task.Task
	for _, key := range []string{"a", "b"} {
		res, err := store.CreateBatch(ctx, []task.NewTask{
			{Kind: "seq", Payload: json.RawMessage(`1`), SequenceKey: key},
			{Kind: "seq", Payload: json.RawMessage(`2`), SequenceKey: key},
		})
		if err != nil {
			t.Fatal(err)
		}
		heads = append(heads, res[0].Task)
	}
	// The head of key a dies: a blocked sequence; key b's runs.
	if _, err := store.Start(ctx, "w", time.Minute, heads[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fail(ctx, "w", task.Failure{ID: heads[0].ID, Error: "bad", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	gauge := func() map[string]float64 {
		t.Helper()
		if err := c.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "ingest_sequences_blocked" {
				continue
			}
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		return got
	}
	if got := gauge(); len(got) != 1 || got["seq"] != 1 {
		t.Fatalf("ingest_sequences_blocked = %v, want seq 1", got)
	}
	if _, err := store.Delete(ctx, heads[0].ID); err != nil {
		t.Fatal(err)
	}
	if got := gauge(); len(got) != 1 || got["seq"] != 0 {
		t.Fatalf("ingest_sequences_blocked after the delete = %v, want seq 0", got)
	}
}
