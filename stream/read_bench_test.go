package stream

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
)

// BenchmarkReadPriorities measures what priorities cost the default path:
// reading 100 new entries, all of the default priority, with one
// XREADGROUP of the task stream (OneStream: a read without priorities)
// and with the consumer's read of every priority's stream (AllPriorities:
// read.lua over the four streams, three of them empty). The entries are
// added and acknowledged outside the timer:
// go test -run '^$' -bench ReadPriorities ./stream/
func BenchmarkReadPriorities(b *testing.B) {
	const n = 100
	ctx := context.Background()
	rdb := testenv.Client(b, testenv.NewRedisServer(b).URL())
	for _, mode := range []string{"OneStream", "AllPriorities"} {
		b.Run(mode, func(b *testing.B) {
			base := "bench:" + mode
			g, err := NewGroup(Config{Stream: base, Group: "g", Consumer: "c"}, rdb)
			if err != nil {
				b.Fatal(err)
			}
			if err := g.EnsureGroup(ctx); err != nil {
				b.Fatal(err)
			}
			r := newPriorityReader(Config{Stream: base, Group: "g", Consumer: "c"}, rdb)
			for range b.N {
				b.StopTimer()
				pipe := rdb.Pipeline()
				for range n {
					pipe.XAdd(ctx, &redis.XAddArgs{Stream: base, Values: []string{"task_id", "x", "kind", "k"}})
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				var got int
				if mode == "OneStream" {
					res, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{base, ">"}, Count: n, Block: -1}).Result()
					if err != nil {
						b.Fatal(err)
					}
					got = len(res[0].Messages)
				} else {
					msgs, err := r.readNew(ctx, n)
					if err != nil {
						b.Fatal(err)
					}
					got = len(msgs)
				}
				b.StopTimer()
				if got != n {
					b.Fatalf("read %d entries, want %d", got, n)
				}
				if err := rdb.Del(ctx, base).Err(); err != nil {
					b.Fatal(err)
				}
				if err := rdb.XGroupCreateMkStream(ctx, base, "g", "0").Err(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "entries/s")
		})
	}
}
