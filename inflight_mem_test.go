package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkInflightRunMemory measures what a worker holds per run in
// flight: 2,000 tasks whose handlers all wait at once (the default task
// settings, no tracing), against the same worker idle. It reports the live
// heap (after a collection) and the goroutine stacks per run; a payload of
// 1 KB per task shows whether a run keeps its payload. The process's RSS
// with 10,000 handlers waiting is about 10,000 × their sum, plus the heap
// the GC lets grow above the live heap, plus the binary.
func BenchmarkInflightRunMemory(b *testing.B) {
	const n = 2000
	ctx := context.Background()
	db := testenv.DB(b)
	streamKey, dlqKey := testenv.Keys(b)
	store, err := task.NewStore(task.Config{Stream: streamKey}, db)
	if err != nil {
		b.Fatal(err)
	}
	rdb := testenv.Client(b, testenv.RedisURL(b))
	payload, _ := json.Marshal(map[string]string{"doc": strings.Repeat("x", 1024)})
	for i := range b.N {
		b.StopTimer()
		nts := make([]task.NewTask, n)
		for i := range nts {
			nts[i] = task.NewTask{Kind: "k", Payload: payload}
		}
		created, err := store.CreateBatch(ctx, nts)
		if err != nil {
			b.Fatal(err)
		}
		var entered atomic.Int64
		release := make(chan struct{})
		consumer := fmt.Sprintf("mem-%d", time.Now().UnixNano())
		w, err := ingest.New(ingest.Config{Stream: streamKey, DLQ: dlqKey, Consumer: consumer,
			Concurrency: n, TaskLease: time.Minute}, store, rdb, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		w.Handle("k", func(ctx context.Context, _ ingest.Task) error {
			entered.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(runCtx) }()
		// The worker idle: its consumer has read the stream.
		testenv.Eventually(b, time.Minute, "the consumer reading", func() bool {
			cs, err := rdb.XInfoConsumers(ctx, streamKey, stream.DefaultGroup).Result()
			if err != nil {
				return false
			}
			for _, c := range cs {
				if c.Name == consumer {
					return true
				}
			}
			return false
		})
		idle := memNow()
		if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range created {
				p.XAdd(ctx, &redis.XAddArgs{Stream: streamKey, Values: stream.Entry{TaskID: c.Task.ID, Kind: "k"}.Values()})
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		testenv.Eventually(b, 5*time.Minute, "every handler waiting", func() bool { return entered.Load() == n })
		busy := memNow()
		b.ReportMetric(float64(int64(busy.HeapAlloc)-int64(idle.HeapAlloc))/n, "heap-B/run")
		b.ReportMetric(float64(int64(busy.StackInuse)-int64(idle.StackInuse))/n, "stack-B/run")
		close(release)
		testenv.Eventually(b, 5*time.Minute, "every task SUCCEEDED", func() bool {
			var c int
			err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE status = 'SUCCEEDED'`).Scan(&c)
			return err == nil && c == n*(i+1)
		})
		stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// memNow returns the memory statistics after two collections.
func memNow() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}
