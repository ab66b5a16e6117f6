package ingest_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
)

// BenchmarkStreamReadAck times the consumer's Redis round trips for 100
// entries: one XREADGROUP COUNT 100 and one pipelined XACK (Group.Apply,
// as the completer sends it).
func BenchmarkStreamReadAck(b *testing.B) {
	const n = 100
	ctx := context.Background()
	rdb := testenv.Client(b, testenv.NewRedisServer(b).URL())
	g, err := stream.NewGroup(stream.Config{Stream: "bench", Group: "g", Consumer: "c"}, rdb)
	if err != nil {
		b.Fatal(err)
	}
	if err := g.EnsureGroup(ctx); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		b.StopTimer()
		pipe := rdb.Pipeline()
		for range n {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: "bench", Values: []string{"task_id", "x", "kind", "k"}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{"bench", ">"}, Count: n, Block: -1}).Result()
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]string, 0, n)
		for _, m := range res[0].Messages {
			ids = append(ids, m.ID)
		}
		if err := g.Apply(ctx, ids, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "entries/s")
}
