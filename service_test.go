package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// serviceBundle is a Service on a database and a redis-server of its own.
type serviceBundle struct {
	t      *testing.T
	db     *testenv.Database
	redis  *testenv.RedisServer
	rdb    *redis.Client
	store  *task.Store
	stream string
	dlq    string
}

func newServiceBundle(t *testing.T) *serviceBundle {
	t.Helper()
	stream, dlq := testenv.Keys(t)
	b := &serviceBundle{t: t, db: testenv.NewDatabase(t), redis: testenv.NewRedisServer(t), stream: stream, dlq: dlq}
	b.rdb = testenv.Client(t, b.redis.URL())
	var err error
	b.store, err = task.NewStore(task.Config{Stream: stream, Backoff: task.Backoff{Base: 50 * time.Millisecond, Max: time.Second, Jitter: 0.1}}, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fastConfig is a ServiceConfig with intervals short enough for tests.
func (b *serviceBundle) fastConfig(consumer string) ingest.ServiceConfig {
	return ingest.ServiceConfig{
		Worker: ingest.Config{
			Stream: b.stream, DLQ: b.dlq, Consumer: consumer, Concurrency: 32,
			TaskLease: time.Second, ReclaimIdle: 500 * time.Millisecond, Block: 100 * time.Millisecond,
			ShutdownTimeout: 5 * time.Second,
		},
		Reclaim: reclaim.Config{Interval: 100 * time.Millisecond},
		Relay: outbox.RelayConfig{PublishInterval: 100 * time.Millisecond,
			Backoff:     backoff.Policy{Base: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: 0.1},
			MaxAttempts: 1000, Lease: 2 * time.Second, PublishTimeout: 500 * time.Millisecond},
		Maintenance: maintenance.Config{
			Rescuer:   maintenance.RescuerConfig{Interval: 200 * time.Millisecond, Grace: 300 * time.Millisecond},
			Retention: maintenance.RetentionConfig{Interval: 200 * time.Millisecond},
		},
	}
}

// start runs a Service with handler h for kind "k" until the test ends.
func (b *serviceBundle) start(cfg ingest.ServiceConfig, h ingest.Handler) {
	b.t.Helper()
	b.run(cfg, map[string]ingest.Handler{"k": h}, slog.LevelError)
}

// run runs a Service of cfg (with the bundle's store configuration) with
// handlers until the test ends, logging at level and above, and returns
// it.
func (b *serviceBundle) run(cfg ingest.ServiceConfig, handlers map[string]ingest.Handler, level slog.Level) *ingest.Service {
	b.t.Helper()
	cfg.Store = b.store.Config()
	return runService(b.t, cfg, b.db.Pool, b.rdb, handlers, level)
}

// runService runs a Service of cfg on pool and rdb with handlers until the
// test ends, logging at level and above, and returns it.
func runService(t *testing.T, cfg ingest.ServiceConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, handlers map[string]ingest.Handler, level slog.Level) *ingest.Service {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	svc, err := ingest.NewService(cfg, pool, rdb, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	for kind, h := range handlers {
		svc.Handle(kind, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service %s: %v", cfg.Worker.Consumer, err)
		}
	})
	return svc
}

func (b *serviceBundle) enqueue(n int) {
	b.t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "k", Payload: json.RawMessage(`{"n":1}`), MaxAttempts: 50}
	}
	if _, err := b.store.CreateBatch(context.Background(), nts); err != nil {
		b.t.Fatal(err)
	}
}

// createKind creates n tasks of kind with an empty payload, in one batch.
func (b *serviceBundle) createKind(kind string, n int) {
	b.t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`)}
	}
	if _, err := b.store.CreateBatch(context.Background(), nts); err != nil {
		b.t.Fatal(err)
	}
}

// query runs a query of one integer (a count).
func (b *serviceBundle) query(q string) int {
	b.t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

func (b *serviceBundle) count(s task.State) int {
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ingest_task WHERE status = $1`, string(s)).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

// eventually waits for cond (see testenv.Eventually).
func (b *serviceBundle) eventually(timeout time.Duration, what string, cond func() bool) {
	b.t.Helper()
	testenv.Eventually(b.t, timeout, what, cond)
}

// TestServiceRunsTasksEndToEnd: tasks created in Postgres reach the
// handler through the outbox, the stream and the consumer, and end
// SUCCEEDED with nothing pending.
func TestServiceRunsTasksEndToEnd(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	var runs atomic.Int64
	b.start(b.fastConfig("w1"), func(ctx context.Context, tk ingest.Task) error {
		runs.Add(1)
		return nil
	})
	b.enqueue(300)
	b.eventually(30*time.Second, "300 tasks SUCCEEDED", func() bool { return b.count(task.Succeeded) == 300 })
	b.eventually(5*time.Second, "nothing pending", func() bool {
		p, err := b.rdb.XPending(context.Background(), b.stream, ingest.DefaultGroup).Result()
		return err == nil && p.Count == 0
	})
	if got := runs.Load(); got != 300 {
		t.Errorf("handler ran %d times for 300 tasks, want 300", got)
	}
}

// TestServiceSurvivesRedisLosingEverything: Redis loses every key mid-run
// (FLUSHALL, and a SHUTDOWN NOSAVE + restart empty); with the worker
// running, every one of 2,000 tasks still ends SUCCEEDED: Postgres is the
// truth and the rescuer makes Redis catch up.
func TestServiceSurvivesRedisLosingEverything(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		lose func(b *serviceBundle)
	}{
		{"FlushAll", func(b *serviceBundle) {
			if err := b.rdb.FlushAll(context.Background()).Err(); err != nil {
				b.t.Fatal(err)
			}
		}},
		{"ShutdownNosaveAndRestart", func(b *serviceBundle) {
			err := b.rdb.Do(context.Background(), "SHUTDOWN", "NOSAVE").Err()
			if err != nil && !errors.Is(err, redis.ErrClosed) && err.Error() != "EOF" {
				b.t.Logf("SHUTDOWN NOSAVE: %v", err)
			}
			b.redis.Kill()
			if err := b.redis.Start(); err != nil {
				b.t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newServiceBundle(t)
			var mu sync.Mutex
			seen := map[string]bool{}
			b.start(b.fastConfig("w1"), func(ctx context.Context, tk ingest.Task) error {
				mu.Lock()
				seen[tk.ID.String()] = true
				mu.Unlock()
				time.Sleep(time.Millisecond) // some work in flight when Redis goes
				return nil
			})
			const total = 2000
			b.enqueue(total / 2)
			b.eventually(30*time.Second, "some tasks done before the loss", func() bool { return b.count(task.Succeeded) >= total/8 })
			tc.lose(b)
			b.enqueue(total / 2)
			b.eventually(90*time.Second, "all tasks SUCCEEDED after Redis lost everything", func() bool {
				return b.count(task.Succeeded) == total
			})
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != total {
				t.Errorf("handler saw %d distinct tasks, want %d", len(seen), total)
			}
			if n := b.count(task.Dead); n != 0 {
				t.Errorf("%d tasks DEAD, want 0", n)
			}
		})
	}
}

// TestServiceConfigDerivesTheQueueFromWorker: the queue's identity is set
// once, in Worker; every other copy is derived from it, and a copy set to
// another value is refused, naming the field.
func TestServiceConfigDerivesTheQueueFromWorker(t *testing.T) {
	t.Parallel()
	w := ingest.Config{Stream: "s", Group: "g", Consumer: "me", ReclaimIdle: time.Minute, TaskLease: 20 * time.Second}
	c := ingest.ServiceConfig{Worker: w}.WithDefaults()
	if c.Store.Stream != "s" || c.Reclaim.Stream != "s" || c.Reclaim.Group != "g" || c.Reclaim.Consumer != "me" ||
		c.Reclaim.MinIdle != time.Minute || c.Reclaim.LeaseIdle != 20*time.Second || c.Relay.ID != "me" || c.Maintenance.Rescuer.Stream != "s" ||
		c.Maintenance.Rescuer.Group != "g" || len(c.Maintenance.Retention.Streams) != 1 || c.Maintenance.Retention.Streams[0] != "s" ||
		c.Maintenance.Consumers.Consumer != "me" || c.Maintenance.Elector.ID != "me" {
		t.Fatalf("WithDefaults did not derive every copy from Worker: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("derived configuration: Validate = %v", err)
	}
	for field, cfg := range map[string]ingest.ServiceConfig{
		"Reclaim.MinIdle":                {Worker: w, Reclaim: reclaim.Config{MinIdle: time.Second}},
		"Reclaim.LeaseIdle":              {Worker: w, Reclaim: reclaim.Config{LeaseIdle: time.Second}},
		"Reclaim.Consumer":               {Worker: w, Reclaim: reclaim.Config{Consumer: "other"}},
		"Store.Stream":                   {Worker: w, Store: task.Config{Stream: "other"}},
		"Maintenance.Rescuer.Group":      {Worker: w, Maintenance: maintenance.Config{Rescuer: maintenance.RescuerConfig{Group: "other"}}},
		"Maintenance.Consumers.Consumer": {Worker: w, Maintenance: maintenance.Config{Consumers: maintenance.ConsumersConfig{Consumer: "other"}}},
	} {
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s set apart from Worker: Validate = %v, want an error naming it", field, err)
		}
	}
	off := ingest.ServiceConfig{Worker: w, Reclaim: reclaim.Config{MinIdle: time.Second}, ReclaimDisabled: true}
	if err := off.Validate(); err != nil {
		t.Errorf("a disabled reclaimer's fields are not used: Validate = %v", err)
	}
}

// TestHandWiredReclaimerTakesTheWorkersIdleTime: a reclaimer fed by a
// worker's sink claims with the worker's reclaim idle time and takes over
// expired leases after the worker's lease, whatever the caller wires; a
// different one is refused.
func TestHandWiredReclaimerTakesTheWorkersIdleTime(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rdb := testenv.Redis(t)
	stream, _ := testenv.Keys(t)
	store, err := task.NewStore(task.Config{Stream: stream}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	w, err := ingest.New(ingest.Config{Stream: stream, Consumer: "w", TaskLease: 3 * time.Second, ReclaimIdle: 2 * time.Second}, store, rdb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := reclaim.New(reclaim.Config{Interval: time.Second}, rdb, db.Pool, w.Sink(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Config(); c.MinIdle != 2*time.Second || c.LeaseIdle != 3*time.Second || c.Stream != stream || c.Consumer != "w" {
		t.Errorf("reclaimer config %+v, want the worker's stream, consumer, idle time and lease", c)
	}
	if _, err := reclaim.New(reclaim.Config{MinIdle: time.Second}, rdb, db.Pool, w.Sink(), nil, nil); err == nil || !strings.Contains(err.Error(), "MinIdle") {
		t.Errorf("MinIdle out of step with the worker: New = %v, want an error naming MinIdle", err)
	}
	if _, err := reclaim.New(reclaim.Config{LeaseIdle: time.Second}, rdb, db.Pool, w.Sink(), nil, nil); err == nil || !strings.Contains(err.Error(), "LeaseIdle") {
		t.Errorf("LeaseIdle out of step with the worker: New = %v, want an error naming LeaseIdle", err)
	}
}
