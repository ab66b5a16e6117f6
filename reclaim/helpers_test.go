package reclaim

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
)

// fakeSink is a stream.Sink with a fixed number of handler slots. Entries
// handed to Process keep their slot until done is called.
type fakeSink struct {
	mu         sync.Mutex
	free       int
	busy       int
	reserves   []int               // what each Reserve call returned
	batches    [][]redis.XMessage  // non-empty Process calls
	violations []string            // protocol errors
	seen       map[string]struct{} // entry ids handed over
}

func newFakeSink(slots int) *fakeSink {
	return &fakeSink{free: slots, seen: map[string]struct{}{}}
}

func (s *fakeSink) Reserve(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := min(n, s.free)
	s.free -= k
	s.reserves = append(s.reserves, k)
	return k
}

func (s *fakeSink) Process(_ context.Context, msgs []redis.XMessage, reserved int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reserved < len(msgs) {
		s.violations = append(s.violations, fmt.Sprintf("Process got %d entries for %d reserved slots", len(msgs), reserved))
	}
	s.free += reserved - len(msgs)
	s.busy += len(msgs)
	if len(msgs) > 0 {
		s.batches = append(s.batches, msgs)
	}
	for _, m := range msgs {
		s.seen[m.ID] = struct{}{}
	}
}

// done releases n slots of handled entries.
func (s *fakeSink) done(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy -= n
	s.free += n
}

func (s *fakeSink) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, b := range s.batches {
		for _, m := range b {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

func (s *fakeSink) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.violations {
		t.Error(v)
	}
}

// freeSlots returns the free slots (to check that reservations come back).
func (s *fakeSink) freeSlots() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.free
}

// bundle is what most tests need.
type bundle struct {
	rdb    *redis.Client
	stream string
	group  string
	sink   *fakeSink
	reg    *prometheus.Registry
	r      *Reclaimer
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// setup creates a group on a fresh stream key of rdb and a Reclaimer with
// consumer "self" on it; cfg's zero fields get small test values.
func setup(t *testing.T, rdb *redis.Client, db *pgxpool.Pool, slots int, cfg Config) *bundle {
	t.Helper()
	ctx := context.Background()
	if cfg.Stream == "" {
		cfg.Stream, _ = testenv.Keys(t)
	}
	if cfg.Group == "" {
		cfg.Group = "ingest-workers"
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "self"
	}
	if cfg.Interval == 0 {
		cfg.Interval = 100 * time.Millisecond
	}
	if err := rdb.XGroupCreateMkStream(ctx, cfg.Stream, cfg.Group, "0").Err(); err != nil {
		t.Fatalf("create group: %v", err)
	}
	sink := newFakeSink(slots)
	reg := prometheus.NewRegistry()
	r, err := New(cfg, rdb, db, sink, testLogger(t), reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { sink.check(t) })
	return &bundle{rdb: rdb, stream: cfg.Stream, group: cfg.Group, sink: sink, reg: reg, r: r}
}

// add appends n entries with fresh task ids and returns their ids.
func (b *bundle) add(t *testing.T, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream,
			Values: stream.Entry{TaskID: uuid.New(), Kind: "test"}.Values()}).Result()
		if err != nil {
			t.Fatalf("XADD: %v", err)
		}
		ids[i] = id
	}
	return ids
}

// read reads up to n new entries as consumer (and does not ack them).
func (b *bundle) read(t *testing.T, consumer string, n int) []string {
	t.Helper()
	res, err := b.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: b.group, Consumer: consumer,
		Streams: []string{b.stream, ">"}, Count: int64(n), Block: -1}).Result()
	if err != nil {
		t.Fatalf("XREADGROUP as %s: %v", consumer, err)
	}
	var ids []string
	for _, s := range res {
		for _, m := range s.Messages {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// setIdle sets the idle time of pending entries, keeping their owner and
// delivery count (what the consumer does for a failed task).
func (b *bundle) setIdle(t *testing.T, idle time.Duration, ids ...string) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		p, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.stream, Group: b.group, Start: id, End: id, Count: 1}).Result()
		if err != nil || len(p) != 1 {
			t.Fatalf("XPENDING %s: %v %v", id, p, err)
		}
		if err := b.rdb.Do(ctx, "XCLAIM", b.stream, b.group, p[0].Consumer, 0, id, "IDLE", idle.Milliseconds(), "JUSTID").Err(); err != nil {
			t.Fatalf("XCLAIM IDLE: %v", err)
		}
	}
}

// pending returns the group's pending entries: id → owner.
func (b *bundle) pending(t *testing.T) map[string]redis.XPendingExt {
	t.Helper()
	p, err := b.rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: b.stream, Group: b.group,
		Start: "-", End: "+", Count: 100000}).Result()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	out := map[string]redis.XPendingExt{}
	for _, e := range p {
		out[e.ID] = e
	}
	return out
}

// counter returns ingest_stream_reclaim_total{result}.
func (b *bundle) counter(t *testing.T, result string) float64 {
	t.Helper()
	return counterValue(t, b.reg, "ingest_stream_reclaim_total", result)
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{result=%q} not registered", name, result)
	return 0
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// PublishOutbox publishes the unsent outbox events of key like the relay
// does (XADD a stream.Entry, then SENT with the entry id) and returns how
// many it published. Tests use it where the relay itself is not the subject.
func PublishOutbox(t testing.TB, db *pgxpool.Pool, rdb redis.UniversalClient, key string) int {
	t.Helper()
	ctx := context.Background()
	rows, err := db.Query(ctx, `SELECT e.id, e.task_id, t.kind FROM outbox_event e JOIN ingest_task t ON t.id = e.task_id
		WHERE e.stream = $1 AND e.status IN ('NEW', 'RETRYING') ORDER BY e.id`, key)
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	type event struct {
		id    int64
		entry stream.Entry
	}
	var events []event
	for rows.Next() {
		var e event
		if err := rows.Scan(&e.id, &e.entry.TaskID, &e.entry.Kind); err != nil {
			t.Fatal(err)
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: e.entry.Values()}).Result()
		if err != nil {
			t.Fatalf("XADD: %v", err)
		}
		if _, err := db.Exec(ctx, `UPDATE outbox_event SET status = 'SENT', stream_id = $2, sent_at = now() WHERE id = $1`, e.id, id); err != nil {
			t.Fatalf("mark outbox event sent: %v", err)
		}
	}
	return len(events)
}
