package maintenance_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/stream"
)

// consumersBundle is a group on a fresh stream key and an idle-consumer
// cleanup on it whose own consumer is "self".
type consumersBundle struct {
	rdb    *redis.Client
	stream string
	group  string
	reg    *prometheus.Registry
	c      *maintenance.Consumers
}

func setupConsumers(t *testing.T, rdb *redis.Client, cfg maintenance.ConsumersConfig) *consumersBundle {
	t.Helper()
	b := &consumersBundle{rdb: rdb, group: stream.DefaultGroup, reg: prometheus.NewRegistry()}
	b.stream, _ = testenv.Keys(t)
	if err := rdb.XGroupCreateMkStream(context.Background(), b.stream, b.group, "0").Err(); err != nil {
		t.Fatalf("create group: %v", err)
	}
	cfg.Stream, cfg.Group, cfg.Consumer = b.stream, b.group, "self"
	var err error
	if b.c, err = maintenance.NewConsumers(cfg, rdb, testLogger(t), b.reg); err != nil {
		t.Fatal(err)
	}
	return b
}

// read adds n entries and reads them as consumer (without acking them).
func (b *consumersBundle) read(t *testing.T, consumer string, n int) []string {
	t.Helper()
	ctx := context.Background()
	for range n {
		if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"task_id", "x", "kind", "test"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	res, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: b.group, Consumer: consumer,
		Streams: []string{b.stream, ">"}, Count: int64(n), Block: -1}).Result()
	if err != nil {
		t.Fatalf("XREADGROUP as %s: %v", consumer, err)
	}
	var ids []string
	for _, m := range res[0].Messages {
		ids = append(ids, m.ID)
	}
	return ids
}

func (b *consumersBundle) pendingTotal(t *testing.T) int64 {
	t.Helper()
	p, err := b.rdb.XPending(context.Background(), b.stream, b.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// errors returns ingest_stream_reclaim_total{result="error"}, where the
// cleanup counts its failures.
func (b *consumersBundle) errors(t *testing.T) float64 {
	t.Helper()
	return metricValue(t, b.reg, "ingest_stream_reclaim_total", "result", "error")
}

// TestRemovesIdleConsumersOnly runs on real Redis only: miniredis v2.40
// does not track consumer idle times for XREADGROUP or XGROUP
// CREATECONSUMER (XINFO CONSUMERS reports -1), so its consumers never look
// idle.
func TestRemovesIdleConsumersOnly(t *testing.T) {
	t.Parallel()
	// Long enough that "fresh", created after the others went idle, stays
	// under it through both passes on a slow machine.
	const idleTimeout = 3 * time.Second
	b := setupConsumers(t, testenv.Redis(t), maintenance.ConsumersConfig{IdleTimeout: idleTimeout})
	ctx := context.Background()
	busy := b.read(t, "busy", 3) // 3 pending, idle as long as the others
	for i := range 50 {
		if err := b.rdb.XGroupCreateConsumer(ctx, b.stream, b.group, "idle-"+strconv.Itoa(i)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.rdb.XGroupCreateConsumer(ctx, b.stream, b.group, "self").Err(); err != nil {
		t.Fatal(err)
	}
	pendingBefore := b.pendingTotal(t)
	testenv.Eventually(t, 60*time.Second, "52 consumers idle past the timeout", func() bool {
		cs, err := b.rdb.XInfoConsumers(ctx, b.stream, b.group).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.Idle < idleTimeout+50*time.Millisecond {
				return false
			}
		}
		return len(cs) == 52
	})
	if err := b.rdb.XGroupCreateConsumer(ctx, b.stream, b.group, "fresh").Err(); err != nil {
		t.Fatal(err)
	}

	removed, err := b.c.RunOnce(ctx)
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if removed != 50 {
		t.Fatalf("removed %d consumers, want the 50 idle ones", removed)
	}
	cs, err := b.rdb.XInfoConsumers(ctx, b.stream, b.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	if want := []string{"busy", "fresh", "self"}; !slices.Equal(names, want) {
		t.Fatalf("consumers left: %v, want %v", names, want)
	}
	if after := b.pendingTotal(t); after != pendingBefore || after != int64(len(busy)) {
		t.Fatalf("XPENDING total %d after the cleanup, want %d (unchanged)", after, pendingBefore)
	}
	if v := b.errors(t); v != 0 {
		t.Errorf("error counter = %v, want 0", v)
	}
	// The next pass finds nothing idle left.
	if n, err := b.c.RunOnce(ctx); err != nil || n != 0 {
		t.Errorf("second pass removed %d, %v; want 0 (nothing idle left)", n, err)
	}
}

// TestConsumerCleanupWithoutGroup: a missing stream or group is nothing to
// clean, not an error (the consumers recreate the group).
func TestConsumerCleanupWithoutGroup(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		b := setupConsumers(t, be.Client, maintenance.ConsumersConfig{IdleTimeout: time.Millisecond})
		ctx := context.Background()
		if err := b.rdb.XGroupDestroy(ctx, b.stream, b.group).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := b.c.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("RunOnce without the group = %d, %v; want 0, nil", n, err)
		}
		if err := b.rdb.Del(ctx, b.stream).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := b.c.RunOnce(ctx); err != nil || n != 0 {
			t.Fatalf("RunOnce without the stream = %d, %v; want 0, nil", n, err)
		}
		if v := b.errors(t); v != 0 {
			t.Errorf("error counter %v for a missing group, want 0", v)
		}
	})
}
