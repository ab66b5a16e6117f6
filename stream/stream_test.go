package stream_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
)

func TestParseEntry(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	many := map[string]any{"task_id": id.String()}
	for i := 0; i < 20; i++ {
		many[uuid.NewString()] = "x"
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		err    error
		want   string // substring of the error
	}{
		{"valid", map[string]any{"task_id": id.String(), "kind": "k"}, nil, ""},
		{"valid without kind", map[string]any{"task_id": id.String()}, nil, ""},
		{"deleted", nil, stream.ErrDeleted, ""},
		{"missing task_id", map[string]any{"kind": "k"}, stream.ErrPoison, "no task_id"},
		{"not a uuid", map[string]any{"task_id": "nope"}, stream.ErrPoison, `"nope" is not a UUID`},
		{"braces", map[string]any{"task_id": "{" + id.String() + "}"}, stream.ErrPoison, "not a UUID"},
		{"no dashes", map[string]any{"task_id": strings.ReplaceAll(id.String(), "-", "")}, stream.ErrPoison, "not a UUID"},
		{"36 bytes of junk", map[string]any{"task_id": strings.Repeat("z", 36)}, stream.ErrPoison, "not a UUID"},
		{"nil uuid", map[string]any{"task_id": uuid.Nil.String()}, stream.ErrPoison, "nil UUID"},
		{"huge", map[string]any{"task_id": strings.Repeat("a", 1<<20)}, stream.ErrPoison, "…"},
		{"too many fields", many, stream.ErrPoison, "21 fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := stream.ParseEntry(redis.XMessage{ID: "1-1", Values: tc.values})
			if !errors.Is(err, tc.err) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.err, tc.want)
			}
			if err == nil && (got.TaskID != id || got.Kind != tc.values["kind"] && tc.values["kind"] != nil) {
				t.Fatalf("got %+v", got)
			}
			if err != nil && got.TaskID != uuid.Nil {
				t.Fatalf("error %v with task id %s", err, got.TaskID)
			}
			if err != nil && len(err.Error()) > 300 {
				t.Fatalf("error too long: %d bytes", len(err.Error()))
			}
		})
	}
}

// TestEntryRoundTrip: an Entry encoded with Values, added with XADD and read
// back with XREAD decodes to the same Entry, and on the wire it is the
// contract's fields: task_id and kind, and traceparent only when set.
func TestEntryRoundTrip(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, _ := testenv.Keys(t)
		entries := []stream.Entry{
			{TaskID: uuid.New(), Kind: "email"},
			{TaskID: uuid.New(), Kind: ""},
			{TaskID: uuid.New(), Kind: "kind with spaces, ünïcödé and \x00\xff bytes"},
			{TaskID: uuid.MustParse("ffffffff-ffff-ffff-ffff-ffffffffffff"), Kind: strings.Repeat("k", 200)},
			{TaskID: uuid.New(), Kind: "traced", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		}
		ids := add(t, b.Client, key, entries...)
		res, err := b.Client.XRead(ctx, &redis.XReadArgs{Streams: []string{key, "0"}, Count: 100, Block: -1}).Result()
		if err != nil || len(res) != 1 || len(res[0].Messages) != len(entries) {
			t.Fatalf("xread: %v %v", res, err)
		}
		for i, msg := range res[0].Messages {
			if msg.ID != ids[i] {
				t.Errorf("entry %d: id %s, XADD returned %s", i, msg.ID, ids[i])
			}
			want := map[string]any{"task_id": entries[i].TaskID.String(), "kind": entries[i].Kind}
			if tp := entries[i].Traceparent; tp != "" {
				want["traceparent"] = tp
			}
			if len(msg.Values) != len(want) || msg.Values["task_id"] != want["task_id"] || msg.Values["kind"] != want["kind"] ||
				msg.Values["traceparent"] != want["traceparent"] {
				t.Errorf("entry %d on the wire: %q, want %q", i, msg.Values, want)
			}
			got, err := stream.ParseEntry(msg)
			if err != nil || got != entries[i] {
				t.Errorf("entry %d: ParseEntry = %+v, %v; want %+v", i, got, err, entries[i])
			}
		}
	})
}

// add XADDs entries to key in one pipeline and returns their ids in order.
func add(t *testing.T, rdb redis.UniversalClient, key string, entries ...stream.Entry) []string {
	t.Helper()
	ctx := context.Background()
	cmds := make([]*redis.StringCmd, len(entries))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, e := range entries {
			cmds[i] = p.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: e.Values()})
		}
		return nil
	}); err != nil {
		t.Fatalf("xadd %s: %v", key, err)
	}
	ids := make([]string, len(cmds))
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	return ids
}

// newEntry returns an entry of a fresh task id.
func newEntry(kind string) stream.Entry { return stream.Entry{TaskID: uuid.New(), Kind: kind} }

// recordingSink has a fixed number of slots, records what it is given and
// keeps every slot until release is called.
type recordingSink struct {
	mu       sync.Mutex
	free     int
	capacity int
	held     int
	got      [][]redis.XMessage
	overrun  bool
}

func newSink(capacity int) *recordingSink { return &recordingSink{free: capacity, capacity: capacity} }

func (s *recordingSink) Reserve(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = min(n, s.free)
	s.free -= n
	return n
}

func (s *recordingSink) Process(_ context.Context, msgs []redis.XMessage, reserved int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(msgs) > reserved {
		s.overrun = true
	}
	s.free += reserved - len(msgs)
	s.held += len(msgs)
	if s.held > s.capacity {
		s.overrun = true
	}
	if len(msgs) > 0 {
		s.got = append(s.got, msgs)
	}
}

func (s *recordingSink) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free += s.held
	s.held = 0
}

func (s *recordingSink) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, b := range s.got {
		for _, m := range b {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

func runConsumer(t *testing.T, c *stream.Consumer) (stop func() time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	var once sync.Once
	var took time.Duration
	stop = func() time.Duration {
		once.Do(func() {
			began := time.Now()
			cancel()
			<-done
			took = time.Since(began)
		})
		return took
	}
	t.Cleanup(func() { stop() })
	return stop
}

func TestGroup(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, _ := testenv.Keys(t)
		g, err := stream.NewGroup(stream.Config{Stream: key, Consumer: "c1"}, b.Client)
		if err != nil {
			t.Fatal(err)
		}
		// Twice: BUSYGROUP is fine.
		for range 2 {
			if err := g.EnsureGroup(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := b.Client.XLen(ctx, key).Result(); err != nil || n != 0 {
			t.Fatalf("MKSTREAM: xlen %d %v", n, err)
		}
		ids := add(t, b.Client, key, newEntry("a"), newEntry("b"))
		res, err := b.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: stream.DefaultGroup, Consumer: "c1",
			Streams: []string{key, ">"}, Count: 10, Block: -1}).Result()
		if err != nil || len(res[0].Messages) != 2 {
			t.Fatalf("read: %v %v", res, err)
		}
		idle := func(id string) redis.XPendingExt {
			ps, err := b.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: stream.DefaultGroup, Start: id, End: id, Count: 1}).Result()
			if err != nil || len(ps) != 1 {
				t.Fatalf("xpending %s: %v %v", id, ps, err)
			}
			return ps[0]
		}
		if err := g.Apply(ctx, nil, []stream.Idle{{ID: ids[0], Idle: time.Minute}, {ID: ids[1], Idle: 2 * time.Minute}}); err != nil {
			t.Fatal(err)
		}
		if i := idle(ids[0]).Idle; i < time.Minute || i > time.Minute+5*time.Second {
			t.Errorf("idle after Apply(idle 1m) = %s", i)
		}
		if i := idle(ids[1]).Idle; i < 2*time.Minute || i > 2*time.Minute+5*time.Second {
			t.Errorf("idle after Apply(idle 2m) = %s", i)
		}
		if err := g.Touch(ctx, ids...); err != nil {
			t.Fatal(err)
		}
		pe := idle(ids[0])
		if pe.Idle > 5*time.Second || pe.Consumer != "c1" {
			t.Errorf("after Touch: %+v", pe)
		}
		// JUSTID keeps the delivery counter on Redis; miniredis (v2.40.0,
		// cmd_stream.go xclaim) raises it even with JUSTID, so this part
		// runs on real Redis only.
		if b.Mini == nil && pe.RetryCount != 1 {
			t.Errorf("delivery count %d after XCLAIM JUSTID, want 1", pe.RetryCount)
		}
		length, pending, err := g.Stats(ctx)
		if err != nil || length != 2 || pending != 2 {
			t.Errorf("Stats = %d %d %v", length, pending, err)
		}
		if err := g.Apply(ctx, ids, nil); err != nil {
			t.Fatal(err)
		}
		if _, pending, _ := g.Stats(ctx); pending != 0 {
			t.Errorf("pending %d after Ack", pending)
		}
		// A touch of an entry that is no longer pending does nothing.
		if err := g.Touch(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		if _, pending, _ := g.Stats(ctx); pending != 0 {
			t.Errorf("Touch re-created a pending entry")
		}
		// Missing stream and group: empty, not an error.
		g2, _ := stream.NewGroup(stream.Config{Stream: key + ":none", Consumer: "c1"}, b.Client)
		if l, p, err := g2.Stats(ctx); err != nil || l != 0 || p != 0 {
			t.Errorf("Stats of a missing stream: %d %d %v", l, p, err)
		}
	})
}

func TestConsumerReadsOwnPendingFirst(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, _ := testenv.Keys(t)
		cfg := stream.Config{Stream: key, Consumer: "c1", Block: 50 * time.Millisecond, Count: 2}
		g, _ := stream.NewGroup(cfg, b.Client)
		if err := g.EnsureGroup(ctx); err != nil {
			t.Fatal(err)
		}
		old := add(t, b.Client, key, newEntry("k"), newEntry("k"), newEntry("k"))
		// An earlier run of c1 read them and died.
		if err := b.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: stream.DefaultGroup, Consumer: "c1",
			Streams: []string{key, ">"}, Count: 10, Block: -1}).Err(); err != nil {
			t.Fatal(err)
		}
		fresh := add(t, b.Client, key, newEntry("k"), newEntry("k"))
		sink := newSink(100)
		c, err := stream.NewConsumer(cfg, b.Client, sink, nil)
		if err != nil {
			t.Fatal(err)
		}
		stop := runConsumer(t, c)
		testenv.Eventually(t, 5*time.Second, "5 entries", func() bool { return len(sink.ids()) == 5 })
		if took := stop(); took > time.Second {
			t.Errorf("Run took %s to stop after cancel (Block 50ms)", took)
		}
		want := append(append([]string{}, old...), fresh...)
		if got := sink.ids(); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("delivered %v, want own pending %v first, then %v", got, old, fresh)
		}
		sink.mu.Lock()
		for _, batch := range sink.got {
			if len(batch) > cfg.Count {
				t.Errorf("a read returned %d entries, Count is %d", len(batch), cfg.Count)
			}
		}
		sink.mu.Unlock()
	})
}

func TestConsumerNeverOverrunsSlots(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		key, _ := testenv.Keys(t)
		for range 10 {
			add(t, b.Client, key, newEntry("k"))
		}
		sink := newSink(3)
		c, _ := stream.NewConsumer(stream.Config{Stream: key, Consumer: "c1", Block: 20 * time.Millisecond}, b.Client, sink, nil)
		runConsumer(t, c)
		for want := 3; want <= 10; want += 3 {
			testenv.Eventually(t, 5*time.Second, "slots filled", func() bool { return len(sink.ids()) >= min(want, 10) })
			if n := len(sink.ids()); n > want {
				t.Fatalf("delivered %d entries, only %d slots were freed so far", n, want)
			}
			sink.release()
		}
		sink.mu.Lock()
		defer sink.mu.Unlock()
		if sink.overrun {
			t.Error("the consumer read more entries than it had reserved slots for")
		}
	})
}

func TestConsumerRecreatesDeletedGroup(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, _ := testenv.Keys(t)
		sink := newSink(100)
		c, _ := stream.NewConsumer(stream.Config{Stream: key, Consumer: "c1", Block: 50 * time.Millisecond}, b.Client, sink, nil)
		runConsumer(t, c)
		add(t, b.Client, key, newEntry("k"))
		testenv.Eventually(t, 5*time.Second, "first entry", func() bool { return len(sink.ids()) == 1 })
		if err := b.Client.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
		id := add(t, b.Client, key, newEntry("k"))[0]
		testenv.Eventually(t, 5*time.Second, "entry after DEL", func() bool {
			ids := sink.ids()
			return len(ids) == 2 && ids[1] == id
		})
	})
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, tc := range []struct {
		cfg   stream.Config
		field string
	}{
		{stream.Config{}, "Consumer"},
		{stream.Config{Consumer: "c", Block: -1}, "Block"},
		{stream.Config{Consumer: "c", Count: -1}, "Count"},
		{stream.Config{Consumer: "c", ErrorBackoff: -1}, "ErrorBackoff"},
	} {
		if _, err := stream.NewGroup(tc.cfg, rdb); err == nil || !strings.HasPrefix(err.Error(), "stream: "+tc.field+": ") {
			t.Errorf("%+v: %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
}
