package stream_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
)

func TestKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		base string
		p    int
		want string
	}{
		{"ingest:tasks", 0, "ingest:tasks"},
		{"ingest:tasks", 2, "ingest:tasks"},
		{"ingest:tasks", 1, "ingest:tasks:p1"},
		{"{ingest}:tasks", 3, "{ingest}:tasks:p3"},
		{"{ingest}:tasks", 4, "{ingest}:tasks:p4"},
	} {
		got := stream.Key(tc.base, tc.p)
		if got != tc.want {
			t.Errorf("Key(%q, %d) = %q, want %q", tc.base, tc.p, got, tc.want)
		}
		if stream.HashTag(got) != stream.HashTag(tc.base) {
			t.Errorf("Key(%q, %d) = %q changes the hash tag", tc.base, tc.p, got)
		}
		want := tc.p
		if want == 0 {
			want = stream.DefaultPriority
		}
		if p, err := stream.PriorityOf(tc.base, got); err != nil || p != want {
			t.Errorf("PriorityOf(%q, %q) = %d, %v; want %d", tc.base, got, p, err, want)
		}
	}
	if _, err := stream.PriorityOf("a", "b"); err == nil {
		t.Error("PriorityOf of another stream: no error")
	}
	for _, tc := range []struct {
		qid  string
		p    int
		id   string
		back string
	}{
		{"1-1", 2, "1-1", "1-1"},
		{"p1/1-1", 1, "1-1", "p1/1-1"},
		{"p4/17-0", 4, "17-0", "p4/17-0"},
		{"p2/1-1", 2, "1-1", "1-1"},
		{"p9/1-1", 2, "p9/1-1", "p9/1-1"},
		{"px/1-1", 2, "px/1-1", "px/1-1"},
	} {
		p, id := stream.SplitID(tc.qid)
		if p != tc.p || id != tc.id || stream.QualifyID(p, id) != tc.back {
			t.Errorf("SplitID(%q) = %d, %q (qualified again %q); want %d, %q, %q", tc.qid, p, id, stream.QualifyID(p, id), tc.p, tc.id, tc.back)
		}
	}
}

// freeingSink takes one entry at a time and frees its slot at once,
// recording the order of delivery.
type freeingSink struct {
	mu   sync.Mutex
	busy bool
	got  []redis.XMessage
}

func (s *freeingSink) Reserve(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy || n == 0 {
		return 0
	}
	s.busy = true
	return 1
}

func (s *freeingSink) Process(_ context.Context, msgs []redis.XMessage, _ int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, msgs...)
	s.busy = false
}

func (s *freeingSink) delivered() []redis.XMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]redis.XMessage(nil), s.got...)
}

// TestConsumerPriorityOrder: the consumer reads higher priorities first,
// and, while priority-1 entries keep arriving, the priority-4 entry is
// still delivered within the documented share (one read in
// PriorityShare serves the lowest non-empty level first): with one slot,
// among the first PriorityShare deliveries.
func TestConsumerPriorityOrder(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, _ := testenv.Keys(t)
		cfg := stream.Config{Stream: key, Consumer: "c1", Block: 50 * time.Millisecond, Count: 1}
		g, err := stream.NewGroup(cfg, b.Client)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.EnsureGroup(ctx); err != nil {
			t.Fatal(err)
		}
		low := add(t, b.Client, stream.Key(key, 4), newEntry("low"))[0]
		add(t, b.Client, stream.Key(key, 3), newEntry("p3"))
		add(t, b.Client, key, newEntry("default"))
		for range 50 {
			add(t, b.Client, stream.Key(key, 1), newEntry("urgent"))
		}
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { // priority-1 work keeps arriving
			for runCtx.Err() == nil {
				b.Client.XAdd(runCtx, &redis.XAddArgs{Stream: stream.Key(key, 1), Values: newEntry("urgent").Values()})
				time.Sleep(time.Millisecond) // a steady producer, not synchronisation
			}
		}()
		sink := &freeingSink{}
		c, err := stream.NewConsumer(cfg, b.Client, sink, nil)
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		var got []redis.XMessage
		testenv.Eventually(t, 10*time.Second, "the priority-4 entry", func() bool {
			got = sink.delivered()
			for _, m := range got {
				if m.ID == stream.QualifyID(4, low) {
					return true
				}
			}
			return false
		})
		stop()
		cancel()
		pos := 0
		for i, m := range got {
			if m.ID == stream.QualifyID(4, low) {
				pos = i + 1
			}
		}
		if pos > stream.PriorityShare {
			t.Errorf("the priority-4 entry was delivery %d, want within the first %d", pos, stream.PriorityShare)
		}
		for i, m := range got[:pos-1] {
			if p, _ := stream.SplitID(m.ID); p != 1 {
				t.Errorf("delivery %d is %s of priority %d; only priority 1 comes before the shared read", i+1, m.ID, p)
			}
		}
		// Acknowledging by message id reaches each entry's own stream.
		var ids []string
		for _, m := range sink.delivered() { // all, now that it stopped
			ids = append(ids, m.ID)
		}
		if err := g.Apply(ctx, ids, nil); err != nil {
			t.Fatal(err)
		}
		for _, p := range stream.Priorities {
			if _, pending, err := g.StatsOf(ctx, stream.Key(key, p)); err != nil || pending != 0 {
				t.Errorf("priority %d: %d pending after Apply, %v; want 0", p, pending, err)
			}
		}
	})
}
