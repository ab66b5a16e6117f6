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
	"github.com/ingest-worker/ingest/kafka"
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

// fastConfig is a Config with intervals short enough for tests.
func (b *serviceBundle) fastConfig(consumer string) ingest.Config {
	return ingest.Config{
		Stream: b.stream, DLQ: b.dlq, Consumer: consumer, Concurrency: 32,
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

// limitConfig is fastConfig with a lease long enough that a heartbeat
// late on a loaded machine never lets one lapse: a test of the limits
// counts runs at once, and a lapsed lease frees its run's slot (as a
// crashed worker's) while the handler still runs.
func (b *serviceBundle) limitConfig(consumer string) ingest.Config {
	cfg := b.fastConfig(consumer)
	cfg.TaskLease, cfg.ReclaimIdle = 4*time.Second, 2*time.Second
	return cfg
}

// start runs a Service with handler h for kind "k" until the test ends.
func (b *serviceBundle) start(cfg ingest.Config, h ingest.Handler) {
	b.t.Helper()
	b.run(cfg, map[string]ingest.Handler{"k": h}, slog.LevelError)
}

// run runs a Service of cfg (with the bundle's store configuration) with
// handlers until the test ends, logging at level and above, and returns
// it.
func (b *serviceBundle) run(cfg ingest.Config, handlers map[string]ingest.Handler, level slog.Level) *ingest.Service {
	b.t.Helper()
	cfg.Store = b.store.Config()
	return runService(b.t, cfg, b.db.Pool, b.rdb, handlers, level)
}

// runService runs a Service of cfg on pool and rdb with handlers until the
// test ends, logging at level and above, and returns it.
func runService(t *testing.T, cfg ingest.Config, pool *pgxpool.Pool, rdb redis.UniversalClient, handlers map[string]ingest.Handler, level slog.Level) *ingest.Service {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	return runServiceOn(t, cfg, pool, ingest.Redis(rdb), handlers, logger)
}

// runServiceOn runs a Service of cfg on pool and queue with handlers until
// the test ends, logging to logger, and returns it.
func runServiceOn(t *testing.T, cfg ingest.Config, pool *pgxpool.Pool, queue ingest.Queue, handlers map[string]ingest.Handler, logger *slog.Logger) *ingest.Service {
	t.Helper()
	svc, err := ingest.NewService(cfg, pool, queue, logger, prometheus.NewRegistry())
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
			t.Errorf("service %s: %v", cfg.Consumer, err)
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

// TestConfigPassesTheQueueDown: the queue's identity is set once (Stream,
// Group, Consumer, ReclaimIdle, TaskLease); WithDefaults passes it down to
// every component, replacing a copy set apart.
func TestConfigPassesTheQueueDown(t *testing.T) {
	t.Parallel()
	base := ingest.Config{Stream: "s", Group: "g", Consumer: "me", ReclaimIdle: time.Minute, TaskLease: 20 * time.Second}
	apart := base
	apart.Store = task.Config{Stream: "other"}
	apart.Reclaim = reclaim.Config{Stream: "other", Group: "other", Consumer: "other", MinIdle: time.Second, LeaseIdle: time.Second}
	apart.Maintenance = maintenance.Config{Rescuer: maintenance.RescuerConfig{Stream: "other", Group: "other"},
		Consumers: maintenance.ConsumersConfig{Stream: "other", Group: "other", Consumer: "other"}}
	for name, cfg := range map[string]ingest.Config{"zero": base, "set apart": apart} {
		c := cfg.WithDefaults()
		if c.Store.Stream != "s" || c.Reclaim.Stream != "s" || c.Reclaim.Group != "g" || c.Reclaim.Consumer != "me" ||
			c.Reclaim.MinIdle != time.Minute || c.Reclaim.LeaseIdle != 20*time.Second || c.Relay.ID != "me" || c.Maintenance.Rescuer.Stream != "s" ||
			c.Maintenance.Rescuer.Group != "g" || len(c.Maintenance.Retention.Streams) != 1 || c.Maintenance.Retention.Streams[0] != "s" ||
			c.Maintenance.Consumers.Stream != "s" || c.Maintenance.Consumers.Group != "g" ||
			c.Maintenance.Consumers.Consumer != "me" || c.Maintenance.Elector.ID != "me" {
			t.Fatalf("%s: WithDefaults did not pass the queue's identity down: %+v", name, c)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: Validate = %v", name, err)
		}
	}
}

// TestConfigErrorsNameTheSettingOnce: a bad setting, of the worker or of
// a component, is reported as "ingest: <setting>: ...", once, in either
// queue mode, and NewService builds nothing.
func TestConfigErrorsNameTheSettingOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	queues := map[string]func() ingest.Queue{
		"redis": func() ingest.Queue { return ingest.Redis(rdb) },
		"kafka": func() ingest.Queue { return ingest.Kafka(kafka.Config{Brokers: []string{"127.0.0.1:1"}}) },
	}
	for mode, queue := range queues {
		for _, tc := range []struct {
			cfg    ingest.Config
			prefix string
		}{
			{ingest.Config{Concurrency: -1}, "ingest: Config.Concurrency: must be between 1 and"},
			{ingest.Config{TaskLease: time.Millisecond}, "ingest: Config.TaskLease: "},
			{ingest.Config{Store: task.Config{MaxAttempts: -1}}, "ingest: Config.Store: "},
			{ingest.Config{Relay: outbox.RelayConfig{BatchSize: -1}}, "ingest: Config.Relay: "},
		} {
			_, err := ingest.NewService(tc.cfg, db.Pool, queue(), nil, nil)
			if err == nil || !strings.HasPrefix(err.Error(), tc.prefix) {
				t.Errorf("%s: %+v: error %v, want one starting %q", mode, tc.cfg, err, tc.prefix)
				continue
			}
			if msg := err.Error(); strings.Count(msg, "ingest:") != 1 || strings.Count(msg, "config:") > 1 {
				t.Errorf("%s: error %q names its setting more than once", mode, msg)
			}
		}
	}
	_, err := ingest.NewService(ingest.Config{Stream: "s"}, db.Pool, queues["kafka"](), nil, nil)
	if err == nil || !strings.HasPrefix(err.Error(), "ingest: Config.Stream: ") {
		t.Errorf("Kafka mode with a stream set: error %v, want one naming Config.Stream", err)
	}
}
