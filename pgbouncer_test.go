package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// bouncerBundle is a database reached through a transaction-pooling
// PgBouncer (pool) and directly (db.Pool), and a Redis of its own keys.
type bouncerBundle struct {
	t       *testing.T
	db      *testenv.Database
	bouncer *testenv.PgBouncer
	pool    *pgxpool.Pool // through PgBouncer, in pgsession.PoolerQueryExecMode
	rdb     *redis.Client
	stream  string
	dlq     string
	store   *task.Store // creates tasks through PgBouncer, without a relay
}

func newBouncerBundle(t *testing.T) *bouncerBundle {
	t.Helper()
	b := &bouncerBundle{t: t, db: testenv.NewDatabase(t), bouncer: testenv.NewPgBouncer(t), rdb: testenv.Redis(t)}
	b.stream, b.dlq = testenv.Keys(t)
	pc, err := pgxpool.ParseConfig(b.bouncer.URL(t, b.db.URL) + "&pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.DefaultQueryExecMode = pgsession.PoolerQueryExecMode
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if b.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.pool.Close)
	if pooled, err := pgsession.PoolPooled(ctx, b.pool); err != nil || !pooled {
		t.Fatalf("the pool does not go through PgBouncer: Pooled = %v, %v", pooled, err)
	}
	if b.store, err = task.NewStore(task.Config{Stream: b.stream}, b.pool); err != nil {
		t.Fatal(err)
	}
	return b
}

// config is a Service configuration with quick timings and listen as its
// LISTEN source.
func (b *bouncerBundle) config(consumer string, listen pgsession.Source) ingest.Config {
	return ingest.Config{
		Listen: listen,
		Store:  task.Config{Stream: b.stream, Backoff: task.Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond, Jitter: 0.1}},
		Stream: b.stream, DLQ: b.dlq, Consumer: consumer, Concurrency: 16,
		TaskLease: time.Second, ReclaimIdle: 500 * time.Millisecond, Block: 100 * time.Millisecond,
		ShutdownTimeout: 5 * time.Second,
		Reclaim:         reclaim.Config{Interval: 100 * time.Millisecond},
		Relay: outbox.RelayConfig{PublishInterval: 100 * time.Millisecond,
			Backoff:     backoff.Policy{Base: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: 0.1},
			MaxAttempts: 1000, Lease: 2 * time.Second, PublishTimeout: 500 * time.Millisecond},
		Maintenance: maintenance.Config{
			Rescuer:   maintenance.RescuerConfig{Interval: 200 * time.Millisecond, Grace: 300 * time.Millisecond},
			Retention: maintenance.RetentionConfig{Interval: 200 * time.Millisecond},
		},
	}
}

// run runs a Service of cfg on the bouncer's pool until the test ends.
func (b *bouncerBundle) run(cfg ingest.Config, handlers map[string]ingest.Handler) *ingest.Service {
	b.t.Helper()
	return runService(b.t, cfg, b.pool, b.rdb, handlers, slog.LevelError)
}

func (b *bouncerBundle) create(kind string, maxAttempts int) uuid.UUID {
	b.t.Helper()
	res, err := b.store.Create(context.Background(), task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`), MaxAttempts: maxAttempts})
	if err != nil {
		b.t.Fatal(err)
	}
	return res.Task.ID
}

func (b *bouncerBundle) get(id uuid.UUID) task.Task {
	b.t.Helper()
	tk, err := b.store.Get(context.Background(), id)
	if err != nil {
		b.t.Fatal(err)
	}
	return tk
}

// directListeners counts the sessions on PostgreSQL itself (seen through
// the direct pool) that LISTEN on this test's database, by application
// name.
func (b *bouncerBundle) directListeners() map[string]int {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT application_name, count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query ILIKE 'LISTEN%' GROUP BY 1`)
	if err != nil {
		b.t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			b.t.Fatal(err)
		}
		out[name] = n
	}
	if err := rows.Err(); err != nil {
		b.t.Fatal(err)
	}
	return out
}

// TestServiceThroughPgBouncer: a Service whose every statement goes
// through a transaction-pooling PgBouncer, with no direct connection
// (Listen.None): tasks created by another process are published by the
// relay's polling, a task succeeds, the tasks of a kind limited to two at
// once succeed (the limiter's statements, through the bouncer), a failing one is retried and succeeds,
// one that always fails ends DEAD with exactly one DLQ entry, and an
// operator's cancel reaches a running handler through the lease renewal.
// Nothing LISTENs, neither through the bouncer nor directly.
func TestServiceThroughPgBouncer(t *testing.T) {
	t.Parallel()
	b := newBouncerBundle(t)
	var cancelled atomic.Bool
	started := make(chan struct{}, 1)
	two := 2
	if _, err := b.store.SetKind(context.Background(), "test", "limited", task.KindUpdate{Concurrency: &two}); err != nil {
		t.Fatal(err)
	}
	var limitedRunning, limitedMax atomic.Int64
	b.run(b.config("w1", pgsession.Source{None: true}), map[string]ingest.Handler{
		"ok": func(context.Context, ingest.Task) error { return nil },
		"limited": func(context.Context, ingest.Task) error {
			n := limitedRunning.Add(1)
			defer limitedRunning.Add(-1)
			for {
				if m := limitedMax.Load(); n <= m || limitedMax.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(20 * time.Millisecond) // a little work, so that starts overlap
			return nil
		},
		"flaky": func(_ context.Context, tk ingest.Task) error {
			if tk.Attempt == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		},
		"bad": func(context.Context, ingest.Task) error { return errors.New("always fails") },
		"long": func(ctx context.Context, _ ingest.Task) error {
			started <- struct{}{}
			<-ctx.Done()
			cancelled.Store(errors.Is(context.Cause(ctx), ingest.ErrCancelled))
			return ctx.Err()
		},
	})
	ok, flaky, bad := b.create("ok", 3), b.create("flaky", 3), b.create("bad", 2)
	var limited []uuid.UUID
	for range 6 {
		limited = append(limited, b.create("limited", 3))
	}
	testenv.Eventually(t, 20*time.Second, "ok and flaky SUCCEEDED, bad DEAD", func() bool {
		return b.get(ok).Status == task.Succeeded && b.get(flaky).Status == task.Succeeded && b.get(bad).Status == task.Dead
	})
	testenv.Eventually(t, 20*time.Second, "the 6 tasks of the limited kind SUCCEEDED", func() bool {
		for _, id := range limited {
			if b.get(id).Status != task.Succeeded {
				return false
			}
		}
		return true
	})
	if m := limitedMax.Load(); m > 2 {
		t.Errorf("the kind limited to 2 ran %d at once", m)
	}
	if tk := b.get(flaky); tk.AttemptCount != 1 {
		t.Errorf("flaky: attempt_count %d, want 1 (one failed run, then success)", tk.AttemptCount)
	}
	if tk := b.get(bad); tk.AttemptCount != 2 || !strings.Contains(tk.LastError, "always fails") {
		t.Errorf("bad: attempt_count %d, last_error %q; want 2 and the handler's error", tk.AttemptCount, tk.LastError)
	}
	testenv.Eventually(t, 10*time.Second, "bad's DLQ entry", func() bool {
		n, err := b.rdb.XLen(context.Background(), b.dlq).Result()
		return err == nil && n >= 1
	})
	entries, err := b.rdb.XRange(context.Background(), b.dlq, "-", "+").Result()
	if err != nil || len(entries) != 1 || entries[0].Values["task_id"] != bad.String() {
		t.Errorf("DLQ: %v, %v; want one entry of task %s", entries, err, bad)
	}

	long := b.create("long", 3)
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the long task did not start")
	}
	if _, err := b.store.Cancel(context.Background(), "test", "stop", long); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the cancelled task CANCELLED", func() bool { return b.get(long).Status == task.Cancelled })
	if !cancelled.Load() {
		t.Error("the handler's context did not end with ErrCancelled")
	}
	if n := listenersThrough(t, b.bouncer); n != 0 {
		t.Errorf("%d listener connections through PgBouncer, want none: %+v", n, b.bouncer.Clients(t))
	}
	if l := b.directListeners(); len(l) != 0 {
		t.Errorf("LISTENing sessions on PostgreSQL: %v, want none without a direct listen connection", l)
	}
}

// TestServiceThroughPgBouncerListensDirectly: with Listen.Conn a direct
// connection, the relay, the cancel listener and the leader's loss
// listener LISTEN on PostgreSQL itself and not through the bouncer. The
// relay polls once an hour here, so the tasks another process creates
// reach the handler only if its NOTIFY arrives on the direct connection;
// the task lease is long, so a cancel reaches the handler quickly only by
// its NOTIFY.
func TestServiceThroughPgBouncerListensDirectly(t *testing.T) {
	t.Parallel()
	b := newBouncerBundle(t)
	cfg := b.config("w1", pgsession.Source{Conn: b.db.Pool.Config().ConnConfig.Copy()})
	cfg.Relay.PublishInterval = time.Hour
	cfg.TaskLease, cfg.ReclaimIdle = time.Minute, time.Hour
	cfg.Reclaim.Interval = time.Second
	cfg.Maintenance.Rescuer.Grace = time.Hour
	var done atomic.Int64
	started := make(chan struct{}, 1)
	var cancelled atomic.Bool
	svc := b.run(cfg, map[string]ingest.Handler{
		"ok": func(context.Context, ingest.Task) error { done.Add(1); return nil },
		"long": func(ctx context.Context, _ ingest.Task) error {
			started <- struct{}{}
			<-ctx.Done()
			cancelled.Store(errors.Is(context.Cause(ctx), ingest.ErrCancelled))
			return ctx.Err()
		},
	})
	want := map[string]int{"ingest-outbox-listener": 1, "ingest-cancel-listener": 1, "ingest-loss-listener": 1}
	testenv.Eventually(t, 15*time.Second, "the three listeners LISTENing on PostgreSQL directly, and the service leading", func() bool {
		l := b.directListeners()
		return svc.Maintainer().IsLeader() && l["ingest-outbox-listener"] == 1 && l["ingest-cancel-listener"] == 1 && l["ingest-loss-listener"] == 1
	})
	if l := b.directListeners(); len(l) != len(want) {
		t.Errorf("LISTENing sessions: %v, want %v", l, want)
	}
	ids := []uuid.UUID{b.create("ok", 3), b.create("ok", 3), b.create("ok", 3)}
	testenv.Eventually(t, 10*time.Second, "3 tasks created elsewhere SUCCEEDED (published on their NOTIFY)", func() bool {
		for _, id := range ids {
			if b.get(id).Status != task.Succeeded {
				return false
			}
		}
		return true
	})
	long := b.create("long", 3)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the long task did not start")
	}
	asked := time.Now()
	if _, err := b.store.Cancel(context.Background(), "test", "stop", long); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, "the cancelled task CANCELLED (by its NOTIFY: the lease renewal is 20 s away)", func() bool {
		return b.get(long).Status == task.Cancelled
	})
	if !cancelled.Load() {
		t.Error("the handler's context did not end with ErrCancelled")
	}
	t.Logf("cancel reached the handler and was recorded %s after the request", time.Since(asked).Round(time.Millisecond))
	if n := listenersThrough(t, b.bouncer); n != 0 {
		t.Errorf("%d listener connections through PgBouncer, want none: %+v", n, b.bouncer.Clients(t))
	}
}

// listenersThrough counts the bouncer's clients named as the sessions that
// LISTEN or wait for a notification (the relay's, the cancel listener, the
// leader's loss listener, a task awaiter). A relay pass names its
// transaction too ("ingest-outbox-pass ..."), for a moment: it is not one.
func listenersThrough(t *testing.T, b *testenv.PgBouncer) int {
	t.Helper()
	n := 0
	for _, name := range []string{"ingest-outbox-listener", "ingest-cancel-listener", "ingest-loss-listener", "ingest-task-awaiter"} {
		n += b.ClientsNamed(t, name)
	}
	return n
}
