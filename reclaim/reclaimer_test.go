package reclaim

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	valid := func(c Config) Config { c.Consumer = "me"; c = c.WithDefaults(); return c }
	tests := []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"Defaults", valid(Config{}), ""},
		{"NoConsumer", func() Config { c := valid(Config{}); c.Consumer = ""; return c }(), "Consumer"},
		{"NegativeInterval", valid(Config{Interval: -time.Second}), "Interval"},
		{"MinIdleBelowOneMillisecond", valid(Config{MinIdle: time.Microsecond}), "MinIdle"},
		{"LeaseIdleBelowOneMillisecond", valid(Config{LeaseIdle: time.Microsecond}), "LeaseIdle"},
		{"BatchSizeNegative", valid(Config{BatchSize: -1}), "BatchSize"},
		{"BatchSizeTooLarge", valid(Config{BatchSize: MaxBatchSize + 1}), "BatchSize"},
		{"BatchSizeMax", valid(Config{BatchSize: MaxBatchSize}), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), "reclaim: "+tt.want+": ")):
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := Config{Consumer: "me"}
	c = c.WithDefaults()
	want := Config{Stream: "ingest:tasks", Group: "ingest-workers", Consumer: "me", Interval: 5 * time.Second,
		MinIdle: 10 * time.Minute, LeaseIdle: 30 * time.Second, BatchSize: 20}
	if c != want {
		t.Fatalf("defaults = %+v, want %+v", c, want)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	db := testenv.DB(t)
	sink := newFakeSink(1)
	ok := Config{Consumer: "me"}
	if _, err := New(Config{}, rdb, db, sink, nil, nil); err == nil || !strings.Contains(err.Error(), "Consumer") {
		t.Errorf("New without Consumer = %v, want an error naming Consumer", err)
	}
	if _, err := New(Config{Consumer: "me", BatchSize: 20000}, rdb, db, sink, nil, nil); err == nil || !strings.Contains(err.Error(), "BatchSize") {
		t.Errorf("New with BatchSize 20000 = %v, want an error naming BatchSize", err)
	}
	if _, err := New(ok, nil, db, sink, nil, nil); err == nil {
		t.Error("New with a nil redis client: no error")
	}
	if _, err := New(ok, rdb, nil, sink, nil, nil); err == nil {
		t.Error("New with a nil pool: no error")
	}
	if _, err := New(ok, rdb, db, nil, nil, nil); err == nil {
		t.Error("New with a nil sink: no error")
	}
	// Two reclaimers on one registry share the collector.
	reg := prometheus.NewRegistry()
	if _, err := New(ok, rdb, db, sink, nil, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ok, rdb, db, sink, nil, reg); err != nil {
		t.Fatalf("second New on one registry: %v", err)
	}
	for _, res := range []string{"claimed", "deleted", "error"} {
		if v := counterValue(t, reg, "ingest_stream_reclaim_total", res); v != 0 {
			t.Errorf("ingest_stream_reclaim_total{result=%q} = %v at start, want 0", res, v)
		}
	}
}

func TestClaimsIdleEntriesOnly(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		b := setup(t, be.Client, testenv.DB(t), 100, Config{})
		ctx := context.Background()
		b.add(t, 5)
		stale := b.read(t, "dead", 3)
		live := b.read(t, "alive", 2)
		b.setIdle(t, 11*time.Minute, stale...) // past the default MinIdle of 10 min
		// miniredis counts a delivery for XCLAIM JUSTID, real Redis does not:
		// compare with the counts before the claim.
		before := b.pending(t)

		res := b.r.runOnce(ctx)
		if res.Claimed != 3 {
			t.Fatalf("claimed %d entries, want 3", res.Claimed)
		}
		if got := sorted(b.sink.ids()); !slices.Equal(got, sorted(stale)) {
			t.Fatalf("sink got %v, want the idle entries %v", got, stale)
		}
		for _, batch := range b.sink.batches {
			for _, m := range batch {
				if m.Values["task_id"] == nil || m.Values["kind"] != "test" {
					t.Errorf("claimed entry %s has fields %v, want task_id and kind", m.ID, m.Values)
				}
			}
		}
		p := b.pending(t)
		for _, id := range stale {
			if want := before[id].RetryCount + 1; p[id].Consumer != "self" || p[id].RetryCount != want {
				t.Errorf("entry %s: owner %s, deliveries %d; want self, %d", id, p[id].Consumer, p[id].RetryCount, want)
			}
		}
		for _, id := range live {
			if p[id].Consumer != "alive" || p[id].RetryCount != before[id].RetryCount {
				t.Errorf("live entry %s: owner %s, deliveries %d; want alive, %d", id, p[id].Consumer, p[id].RetryCount, before[id].RetryCount)
			}
		}
		if v := b.counter(t, "claimed"); v != 3 {
			t.Errorf("claimed counter = %v, want 3", v)
		}
		// The claimed entries are fresh again: a second round claims nothing.
		if res := b.r.runOnce(ctx); res.Claimed != 0 {
			t.Errorf("second round claimed %d, want 0", res.Claimed)
		}
		if free := b.sink.freeSlots(); free != 97 {
			t.Errorf("free slots %d, want 97 (100 minus 3 entries in flight)", free)
		}
	})
}

func TestClaimsAfterRealIdleTime(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		const minIdle = 300 * time.Millisecond
		b := setup(t, be.Client, testenv.DB(t), 100, Config{MinIdle: minIdle})
		b.add(t, 4)
		readAt := time.Now()
		ids := b.read(t, "dead", 4)
		var claimedAt time.Time
		testenv.Eventually(t, 5*time.Second, "the entries to be claimed", func() bool {
			b.r.runOnce(context.Background())
			claimedAt = time.Now()
			return len(b.sink.ids()) == len(ids)
		})
		// Redis keeps delivery times and its clock in whole milliseconds,
		// so an entry can pass MinIdle up to a millisecond early by this
		// process's clock (a run failed at 299.8 ms).
		if d := claimedAt.Sub(readAt); d < minIdle-2*time.Millisecond {
			t.Fatalf("claimed %s after the read, before MinIdle %s", d, minIdle)
		}
	})
}

func TestClaimsWithinFreeCapacity(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		b := setup(t, be.Client, testenv.DB(t), 3, Config{BatchSize: 20})
		ctx := context.Background()
		b.add(t, 10)
		ids := b.read(t, "dead", 10)
		b.setIdle(t, time.Hour, ids...)

		// 3 free slots: claims exactly 3 (COUNT 3), then stops.
		if res := b.r.runOnce(ctx); res.Claimed != 3 {
			t.Fatalf("claimed %d with 3 free slots, want 3", res.Claimed)
		}
		if b.sink.reserves[0] != 3 {
			t.Fatalf("reserved %v, want 3 first", b.sink.reserves)
		}
		owned := func() int {
			n := 0
			for _, e := range b.pending(t) {
				if e.Consumer == "self" {
					n++
				}
			}
			return n
		}
		if n := owned(); n != 3 {
			t.Fatalf("self owns %d pending entries, want 3 (never more than it can run)", n)
		}
		// No free slot: the round is skipped, nothing is claimed.
		if res := b.r.runOnce(ctx); res.Claimed != 0 || !res.Skipped {
			t.Fatalf("round without capacity: %+v, want skipped and nothing claimed", res)
		}
		if n := owned(); n != 3 {
			t.Fatalf("self owns %d pending entries after a full round, want 3", n)
		}
		// Slots come free: the rest is claimed.
		b.sink.done(3)
		b.sink.mu.Lock()
		b.sink.free += 100
		b.sink.mu.Unlock()
		if res := b.r.runOnce(ctx); res.Claimed != 7 {
			t.Fatalf("claimed %d once slots were free, want 7", res.Claimed)
		}
		if got := sorted(b.sink.ids()); !slices.Equal(got, sorted(ids)) {
			t.Fatalf("sink got %v, want %v", got, ids)
		}
	})
}

func TestPagesThroughThePendingList(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		b := setup(t, be.Client, testenv.DB(t), 1000, Config{BatchSize: 2})
		b.add(t, 30)
		ids := b.read(t, "dead", 30)
		var idle []string
		for i, id := range ids {
			if i%3 == 0 { // every third entry is idle, spread over the PEL
				idle = append(idle, id)
			}
		}
		b.setIdle(t, time.Hour, idle...)
		res := b.r.runOnce(context.Background())
		if res.Claimed != len(idle) {
			t.Fatalf("claimed %d in one round, want %d", res.Claimed, len(idle))
		}
		for _, batch := range b.sink.batches {
			if len(batch) > 2 {
				t.Errorf("a page of %d entries, want at most BatchSize 2", len(batch))
			}
		}
		if got := sorted(b.sink.ids()); !slices.Equal(got, sorted(idle)) {
			t.Fatalf("sink got %v, want %v", got, idle)
		}
		if free := b.sink.freeSlots(); free != 1000-len(idle) {
			t.Fatalf("free slots %d, want %d: unused reservations must come back", free, 1000-len(idle))
		}
	})
}

func TestMissingGroupSkipsRound(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		b := setup(t, be.Client, testenv.DB(t), 10, Config{})
		ctx := context.Background()
		if err := b.rdb.Del(ctx, b.stream).Err(); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if res := b.r.runOnce(ctx); res.Claimed != 0 {
				t.Fatalf("claimed %d without a group", res.Claimed)
			}
		}
		if free := b.sink.freeSlots(); free != 10 {
			t.Fatalf("free slots %d, want 10: the reservation must come back", free)
		}
		if v := b.counter(t, "error"); v != 0 {
			t.Errorf("error counter %v for a missing group, want 0 (not an error: the consumer recreates it)", v)
		}
		// The group comes back: the reclaimer carries on.
		if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, b.group, "0").Err(); err != nil {
			t.Fatal(err)
		}
		b.add(t, 1)
		ids := b.read(t, "dead", 1)
		b.setIdle(t, time.Hour, ids...)
		if res := b.r.runOnce(ctx); res.Claimed != 1 {
			t.Fatalf("claimed %d after the group came back, want 1", res.Claimed)
		}
	})
}

func TestRunClaimsEveryIntervalUntilCancelled(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		b := setup(t, be.Client, testenv.DB(t), 100, Config{Interval: 50 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- b.r.Run(ctx) }()

		b.add(t, 2)
		ids := b.read(t, "dead", 2)
		b.setIdle(t, time.Hour, ids[0])
		testenv.Eventually(t, 5*time.Second, "the first entry to be claimed", func() bool { return len(b.sink.ids()) == 1 })
		b.setIdle(t, time.Hour, ids[1]) // falls due later: claimed by a later tick
		testenv.Eventually(t, 5*time.Second, "the second entry to be claimed", func() bool { return len(b.sink.ids()) == 2 })

		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run returned %v, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	})
}
