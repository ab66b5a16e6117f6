// Command chaosworker is the worker process of the reliability suite
// (internal/chaos): an ingest.Service with test handlers that record every
// execution in the chaos_effect table. The suite builds it, starts several,
// and kills, freezes and restarts them and the servers under them.
//
// It is configured only through the environment (CHAOS_*, see config).
// CHAOS_ROLE=relay runs only an outbox relay (the suite freezes it past its
// claim lease while the workers' relays carry on).
//
// CHAOS_PERIODIC (the JSON of INGEST_PERIODIC) gives the elected leader
// periodic schedules.
//
// Task kinds:
//   - ok:    sleep the payload's "ms" (cut short by a cancel), record the
//     execution, succeed;
//   - tick:  as ok (the kind of periodic schedules);
//   - held:  as ok (a kind the suite pauses and resumes);
//   - capped, rated, grouped, sequenced: as ok, and the run's start and
//     end are recorded in chaos_run (kinds the suite limits per kind, per
//     group or per sequence key: their overlaps are measured);
//   - long:  sleep CHAOS_LONG_MS, record, succeed;
//   - panic: record, then panic (the task ends DEAD after its attempts);
//   - pipe.doc, pipe.chunk, pipe.join: a document pipeline whose tasks
//     check the results of their dependencies (pipeline.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/pguuid"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

func main() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level()}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, logger); err != nil {
		logger.Error("chaosworker failed", "err", err)
		os.Exit(1)
	}
}

func level() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv("CHAOS_LOG_LEVEL"))); err != nil {
		return slog.LevelWarn
	}
	return l
}

// env returns the environment variable name, or def when unset.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// millis returns the environment variable name as milliseconds.
func millis(name string, def int) time.Duration {
	n, err := strconv.Atoi(env(name, strconv.Itoa(def)))
	if err != nil {
		n = def
	}
	return time.Duration(n) * time.Millisecond
}

func integer(name string, def int) int {
	n, err := strconv.Atoi(env(name, strconv.Itoa(def)))
	if err != nil {
		return def
	}
	return n
}

func run(ctx context.Context, logger *slog.Logger) error {
	dbURL, redisURL := os.Getenv("CHAOS_DATABASE_URL"), os.Getenv("CHAOS_REDIS_URL")
	consumer := env("CHAOS_CONSUMER", ingest.DefaultConsumer())
	stream, dlq := env("CHAOS_STREAM", ingest.DefaultStream), env("CHAOS_DLQ", ingest.DefaultDLQ)
	logger = logger.With("consumer", consumer)

	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("CHAOS_DATABASE_URL %s: invalid", redact.DSN(dbURL))
	}
	pcfg.MaxConns = 16
	pcfg.AfterConnect = pguuid.AfterConnect // as the binary's pool
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL %s: %w", redact.DSN(dbURL), err)
	}
	defer pool.Close()

	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return fmt.Errorf("CHAOS_REDIS_URL %s: invalid", redact.DSN(redisURL))
	}
	concurrency := integer("CHAOS_CONCURRENCY", 8)
	opt.PoolSize = max(opt.PoolSize, concurrency+8)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	// Start-up check: a wrong password or an unreachable server stops the
	// process with a clear message that names the server, not the secret.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("connect to Redis %s: %w", redact.DSN(redisURL), err)
	}

	relayCfg := outbox.RelayConfig{
		ID:              consumer,
		BatchSize:       integer("CHAOS_RELAY_BATCH", 50),
		PublishInterval: millis("CHAOS_RELAY_INTERVAL_MS", 100),
		Lease:           millis("CHAOS_RELAY_LEASE_MS", 2000),
		PublishTimeout:  millis("CHAOS_RELAY_PUBLISH_TIMEOUT_MS", 500),
		Backoff:         backoff.Policy{Base: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: 0.1},
		MaxAttempts:     1000,
	}
	if env("CHAOS_ROLE", "worker") == "relay" {
		relay, err := outbox.NewRelay(relayCfg, pool, rdb, logger, prometheus.NewRegistry())
		if err != nil {
			return err
		}
		logger.Info("relay started")
		return relay.Run(ctx)
	}

	schedules, err := maintenance.ParseSchedules("CHAOS_PERIODIC", []byte(env("CHAOS_PERIODIC", "")))
	if err != nil {
		return err
	}
	cfg := ingest.Config{
		Store:  task.Config{Backoff: task.Backoff{Base: 50 * time.Millisecond, Max: time.Second, Jitter: 0.1}},
		Stream: stream, DLQ: dlq, Consumer: consumer, Concurrency: concurrency,
		TaskLease:       millis("CHAOS_TASK_LEASE_MS", 3000),
		ReclaimIdle:     millis("CHAOS_RECLAIM_IDLE_MS", 4000),
		Block:           200 * time.Millisecond,
		ShutdownTimeout: 2 * time.Second,
		Reclaim:         reclaim.Config{Interval: millis("CHAOS_RECLAIM_INTERVAL_MS", 200)},
		Relay:           relayCfg,
		RelayDisabled:   env("CHAOS_RELAY", "on") == "off",
		Maintenance: maintenance.Config{
			Rescuer:   maintenance.RescuerConfig{Interval: 300 * time.Millisecond, Grace: time.Second},
			Retention: maintenance.RetentionConfig{Interval: 500 * time.Millisecond},
			Consumers: maintenance.ConsumersConfig{Interval: time.Second},
			Periodic:  maintenance.PeriodicConfig{Schedules: schedules, Interval: 100 * time.Millisecond},
		},
	}
	svc, err := ingest.NewService(cfg, pool, ingest.Redis(rdb), logger, prometheus.NewRegistry())
	if err != nil {
		return err
	}
	h := &handlers{pool: pool, worker: consumer, long: millis("CHAOS_LONG_MS", 5000)}
	svc.Handle("ok", h.ok)
	svc.Handle("tick", h.ok)
	svc.Handle("held", h.ok)
	svc.Handle("capped", h.timed)
	svc.Handle("rated", h.timed)
	svc.Handle("sequenced", h.timed)
	svc.Handle("grouped", h.timed)
	svc.Handle("long", h.longRun)
	svc.Handle("panic", h.panics)
	h.registerPipeline(svc)
	logger.Info("worker started")
	return svc.Run(ctx)
}

// handlers are the test handlers; each execution inserts one chaos_effect
// row (several rows for one task are duplicate executions).
type handlers struct {
	pool   *pgxpool.Pool
	worker string
	long   time.Duration
}

func (h *handlers) record(ctx context.Context, t ingest.Task) error {
	_, err := h.pool.Exec(ctx, `INSERT INTO chaos_effect (task_id, run_at, worker) VALUES ($1, now(), $2)`, t.ID, h.worker)
	if err != nil {
		return fmt.Errorf("record effect: %w", err)
	}
	return nil
}

func (h *handlers) ok(ctx context.Context, t ingest.Task) error {
	var p struct {
		MS int `json:"ms"`
	}
	_ = json.Unmarshal(t.Payload, &p)
	if p.MS > 0 {
		if err := sleep(ctx, time.Duration(p.MS)*time.Millisecond); err != nil {
			return err
		}
	}
	return h.record(ctx, t)
}

// timed is ok with the run's start and end in chaos_run (the end stays
// NULL when the process is killed during the run).
func (h *handlers) timed(ctx context.Context, t ingest.Task) error {
	var at time.Time
	if err := h.pool.QueryRow(ctx, `INSERT INTO chaos_run (task_id, worker, started_at) VALUES ($1, $2, clock_timestamp()) RETURNING started_at`,
		t.ID, h.worker).Scan(&at); err != nil {
		return fmt.Errorf("record run start: %w", err)
	}
	err := h.ok(ctx, t)
	// A failed write leaves the end NULL, which the suite reports; the
	// task's outcome does not depend on it.
	_, _ = h.pool.Exec(context.WithoutCancel(ctx), `UPDATE chaos_run SET ended_at = clock_timestamp() WHERE task_id = $1 AND worker = $2 AND started_at = $3`,
		t.ID, h.worker, at)
	return err
}

func (h *handlers) longRun(ctx context.Context, t ingest.Task) error {
	if err := sleep(ctx, h.long); err != nil {
		return err
	}
	return h.record(ctx, t)
}

func (h *handlers) panics(ctx context.Context, t ingest.Task) error {
	if err := h.record(ctx, t); err != nil {
		return err
	}
	panic(errors.New("chaos: poison task"))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
