package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkKafkaThroughput measures Kafka mode end to end on an in-process
// cluster (kfake, 8 partitions) and the test PostgreSQL: 5,000 tasks are
// created first, then timed from the start of the relay and the worker
// (default settings, a no-op handler) until all are SUCCEEDED.
//
//	go test -run '^$' -bench BenchmarkKafkaThroughput -benchtime 1x .
func BenchmarkKafkaThroughput(b *testing.B) {
	const n = 5000
	for range b.N {
		b.StopTimer()
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, kafka.DefaultTopic, kafka.DefaultDLQTopic))
		if err != nil {
			b.Fatal(err)
		}
		db := testenv.DB(b)
		store, err := task.NewStore(task.Config{Stream: kafka.DefaultTopic}, db)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		for i := 0; i < n; i += 1000 {
			nts := make([]task.NewTask, 1000)
			for j := range nts {
				nts[j] = task.NewTask{Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i+j))}
			}
			if _, err := store.CreateBatch(ctx, nts); err != nil {
				b.Fatal(err)
			}
		}
		svc, err := ingest.NewService(ingest.Config{Store: store.Config(), Relay: outbox.RelayConfig{BatchSize: 500}},
			db, ingest.Kafka(kafka.Config{Brokers: c.ListenAddrs()}), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		svc.Handle("k", func(context.Context, ingest.Task) error { return nil })
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { done <- svc.Run(runCtx) }()
		testenv.Eventually(b, 5*time.Minute, "all SUCCEEDED", func() bool {
			var left int
			_ = db.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE status <> 'SUCCEEDED'`).Scan(&left)
			return left == 0
		})
		took := time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		c.Close()
		b.ReportMetric(n/took.Seconds(), "tasks/s")
	}
}
