package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkRelayDrainOnce times one relay pass over 100 committed rows:
// the claim, the pipelined XADDs and the update marking them SENT.
func BenchmarkRelayDrainOnce(b *testing.B) {
	const n = 100
	ctx := context.Background()
	db := testenv.DB(b)
	rdb := testenv.Client(b, testenv.NewRedisServer(b).URL())
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		b.Fatal(err)
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{BatchSize: n}, db, rdb, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "bench", Payload: json.RawMessage(`{"n":1}`)}
	}
	for range b.N {
		b.StopTimer()
		if _, err := store.CreateBatch(ctx, nts); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := r.DrainOnce(ctx)
		if err != nil || res.Published != n {
			b.Fatalf("DrainOnce = %+v, %v", res, err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
}
