package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// TestMeasureLatencyAndThroughput logs commit-to-XADD latency and relay
// throughput on the real servers. Nothing is asserted about the numbers
// (they depend on the machine, and -race slows everything several times).
// Not parallel, so other tests do not skew them; -short shrinks it.
func TestMeasureLatencyAndThroughput(t *testing.T) {
	creates, rows := 1000, 20000
	if testing.Short() {
		creates, rows = 100, 2000
	}
	t.Run("CommitToXADD", func(t *testing.T) { measureLatency(t, creates) })
	for _, batch := range []int{100, outbox.DefaultBatchSize} {
		t.Run(fmt.Sprintf("ThroughputBatch%d", batch), func(t *testing.T) { measureThroughput(t, rows, batch) })
	}
}

// measureLatency creates tasks one at a time with a relay running (default
// config) and a reader blocked in XREAD on the stream; latency is from
// Create's return (the commit) to the reader seeing the entry.
func measureLatency(t *testing.T, n int) {
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := b.relay(t, outbox.RelayConfig{})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to LISTEN", func() bool { return outbox.Listens(r) >= 1 })

	var mu sync.Mutex
	seen := map[string]time.Time{}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		last := "0"
		for ctx.Err() == nil {
			s, err := b.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{b.stream, last}, Block: 200 * time.Millisecond, Count: 100}).Result()
			now := time.Now()
			if err != nil {
				continue // redis.Nil on timeout; context cancelled at the end
			}
			mu.Lock()
			for _, m := range s[0].Messages {
				seen[m.Values["task_id"].(string)] = now
				last = m.ID
			}
			mu.Unlock()
		}
	}()

	committed := make(map[string]time.Time, n)
	for i := range n {
		c, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		if err != nil {
			t.Fatal(err)
		}
		committed[c.Task.ID.String()] = time.Now()
	}
	testenv.Eventually(t, 30*time.Second, "every entry read", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	})
	cancel()
	<-readerDone
	lat := make([]time.Duration, 0, n)
	for id, at := range committed {
		lat = append(lat, max(seen[id].Sub(at), 0))
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	t.Logf("commit → XADD visible to XREAD over %d single-task creates: p50 %s, p90 %s, p99 %s, max %s",
		n, q(0.5), q(0.9), q(0.99), lat[len(lat)-1])
}

// measureThroughput preloads rows and drains them with one relay.
func measureThroughput(t *testing.T, rows, batch int) {
	b := setup(t)
	ctx := context.Background()
	b.preload(t, rows)
	r := b.relay(t, outbox.RelayConfig{BatchSize: batch})
	start := time.Now()
	published := 0
	for {
		res, err := r.DrainOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			break
		}
		published += res.Published
	}
	elapsed := time.Since(start)
	if published != rows || b.unsent(t) != 0 {
		t.Fatalf("published %d of %d rows", published, rows)
	}
	t.Logf("one relay, batch %d: %d rows in %s = %.0f rows/s", batch, rows, elapsed.Round(time.Millisecond),
		float64(rows)/elapsed.Seconds())
}
