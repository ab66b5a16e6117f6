package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/migrations"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

const runLong = `Run a worker process: stream consumers (INGEST_WORKER_CONCURRENCY tasks at a
time), the reclaimer (crashed workers' entries, due retries), the outbox relay
(publishes committed tasks to Redis), the rescuer (republishes tasks whose
stream entry was lost), outbox retention and stream trimming, and the HTTP
server on INGEST_HTTP_ADDR (/metrics, /healthz, /readyz, the task API and
the web dashboard at /ui/).
Run as many processes as you like against the same PostgreSQL and Redis: one
of them at a time, elected leader (table ingest_leader, metric ingest_leader),
runs the rescuer, retention and the removal of idle consumers; when it stops
or dies another takes over within seconds.

A handler is required. The binary's built-in one is the webhook: with
INGEST_WEBHOOK_URL (or --webhook-url) set, every task is POSTed there as
{"task_id", "kind", "payload", "attempt"} with an Idempotency-Key header; a 2xx
answer is success, 408/429/5xx or no answer a retry (Retry-After honoured),
any other 4xx a permanent failure. For handlers in Go, import the library
(github.com/ingest-worker/ingest) and write your own main.

Start-up checks: the schema must be current (else: run 'ingest-worker
migrate'); the consumer group is created if missing; a Redis
maxmemory-policy other than noeviction is warned about (Redis could evict
tasks).

SIGTERM or SIGINT shuts down gracefully: reading stops, running tasks get
INGEST_SHUTDOWN_TIMEOUT_MS to finish, the rest are handed back to other
workers without counting a failure; nothing unfinished is acknowledged. A
second signal exits at once.`

const noHandlerHelp = `no task handler configured: 'run' needs one. Choose:
  - the built-in webhook: set INGEST_WEBHOOK_URL (or --webhook-url) to an http(s) URL that receives every task;
  - your own Go handlers: import github.com/ingest-worker/ingest, register them with Worker.Handle and build your own binary;
  - just looking? 'ingest-worker demo' runs scripted tasks with zero setup`

func (a *app) runCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the worker: consumers, reclaimer, outbox relay, rescuer, retention, HTTP server",
		Long:  runLong,
		Example: `  INGEST_WEBHOOK_URL=https://hooks.example.com/ingest ingest-worker run
  ingest-worker run --webhook-url http://localhost:9000/hook --worker-concurrency 64 --http-addr :8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			if a.cfg.WebhookURL == "" {
				return usagef("%s", noHandlerHelp)
			}
			a.limitMemory()
			register, err := a.webhookHandler()
			if err != nil {
				return usageErr(err)
			}
			ctx := cmd.Context()
			stopTracing, err := a.startTracing(ctx)
			if err != nil {
				return err
			}
			defer stopTracing()
			pool, rdb, closeAll, err := a.mode().openServers(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			st, err := a.newStack(ctx, pool, rdb)
			if err != nil {
				return err
			}
			if err := register(st.svc); err != nil {
				return usageErr(err)
			}
			return st.run(ctx, nil)
		},
	}
	addFlags(cmd.Flags(), scopeWorker)
	return cmd
}

// stack is everything a worker process runs, built from the configuration:
// the ingest.Service (worker, reclaimer, outbox relay, maintenance)
// and the HTTP server.
type stack struct {
	a     *app
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	store *task.Store
	reg   *prometheus.Registry
	svc   *ingest.Service
	api   *api.Server

	stopping atomic.Bool
}

// startupChecks runs the checks of a worker's start: the schema is current,
// the group exists, Redis will not evict tasks.
func (a *app) startupChecks(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient) error {
	if err := migrations.Check(ctx, pool); err != nil {
		return fmt.Errorf("schema check: %w", err)
	}
	g, err := stream.NewGroup(stream.Config{Stream: a.cfg.StreamKey, Group: a.cfg.Group, Consumer: a.cfg.ConsumerName}, rdb)
	if err != nil {
		return usageErr(err)
	}
	if err := g.EnsureGroup(ctx); err != nil {
		return err
	}
	// Every master of a cluster: any of them may hold the stream after a
	// resharding or failover.
	_ = forEachRedisNode(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		policy, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		switch {
		case err != nil:
			a.log.Debug("could not read Redis maxmemory-policy (CONFIG GET refused?); make sure it is noeviction", "redis", c.Options().Addr, "err", err)
		case policy["maxmemory-policy"] != "" && policy["maxmemory-policy"] != "noeviction":
			a.log.Warn("Redis maxmemory-policy is not noeviction: under memory pressure Redis may evict stream entries (the rescuer republishes their tasks, late); set maxmemory-policy noeviction",
				"redis", c.Options().Addr, "maxmemory-policy", policy["maxmemory-policy"])
		}
		return nil
	})
	return nil
}

// newStack checks the environment and builds the service and the API.
// Configuration errors the components find are usage errors (exit 2).
// opts are extra franz-go client options (Kafka mode; tests).
func (a *app) newStack(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient, opts ...kgo.Opt) (*stack, error) {
	cfg, queue, err := a.mode().service(ctx, pool, rdb, opts...)
	if err != nil {
		return nil, err
	}
	c := a.cfg
	if cfg.Listen, err = a.listenSource(ctx, pool); err != nil {
		return nil, err
	}
	cfg.Consumer, cfg.Concurrency = c.ConsumerName, c.WorkerConcurrency
	cfg.TaskLease, cfg.TaskTimeout, cfg.ShutdownTimeout = c.TaskLease, c.TaskTimeout, c.ShutdownTimeout
	cfg.Maintenance = maintenance.Config{Periodic: maintenance.PeriodicConfig{Schedules: c.periodic()}, Retention: c.retention()}
	s := &stack{a: a, pool: pool, rdb: rdb, reg: prometheus.NewRegistry()}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if s.svc, err = ingest.NewService(cfg, pool, queue, a.log, s.reg); err != nil {
		return nil, usageErr(err)
	}
	s.store = s.svc.Store()
	checks := s.checks()
	apiCfg := api.Config{Token: c.APIToken, Logger: a.log.With("component", "api"), Actor: "api:" + c.ConsumerName,
		Periodic: s.svc.Maintainer().NextSlots, Registerer: s.reg}
	if rdb != nil {
		apiCfg.DLQClient, apiCfg.DLQKey = rdb, c.DLQStreamKey
	}
	if s.api, err = api.New(apiCfg, s.store, checks, s.reg); err != nil {
		return nil, usageErr(err)
	}
	return s, nil
}

// checks are the readiness checks of /readyz.
func (s *stack) checks() api.Checks {
	scrub := func(err error) error {
		if err == nil {
			return nil
		}
		return scrubbedError{msg: s.a.scrub.String(err.Error()), err: err}
	}
	return api.Checks{
		"postgres": func(ctx context.Context) error { return scrub(s.pool.Ping(ctx)) },
		// The queue's servers: "redis" or "kafka".
		s.a.cfg.Queue: func(ctx context.Context) error { return scrub(s.svc.Ping(ctx)) },
		"schema":      func(ctx context.Context) error { return scrub(migrations.Check(ctx, s.pool)) },
		"worker": func(context.Context) error {
			if s.stopping.Load() {
				return errors.New("shutting down")
			}
			return nil
		},
	}
}

// scrubbedError is an error whose text has its secrets masked; it keeps
// the error it came from for errors.Is and errors.As (/readyz tells an
// unreachable server from other failures by it).
type scrubbedError struct {
	msg string
	err error
}

func (e scrubbedError) Error() string { return e.msg }
func (e scrubbedError) Unwrap() error { return e.err }

// listen opens the HTTP listener ("" address: none).
func (s *stack) listen() (net.Listener, error) {
	if s.a.cfg.HTTPAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", s.a.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("INGEST_HTTP_ADDR: listen on %s: %w", s.a.cfg.HTTPAddr, err)
	}
	return ln, nil
}

// run runs the worker, its companions and the HTTP server (on ln, or on
// INGEST_HTTP_ADDR when ln is nil) until ctx is cancelled or one of them
// fails, then shuts down in order: the worker drains (running tasks finish
// or are handed back) while the reclaimer, relay and maintenance stop; the
// HTTP server, answering "not ready" meanwhile, stops last.
func (s *stack) run(ctx context.Context, ln net.Listener) error {
	log := s.a.log
	if ln == nil {
		var err error
		if ln, err = s.listen(); err != nil {
			return err
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	var srv *http.Server
	var allowedHosts string
	httpDone := make(chan error, 1)
	if ln != nil {
		h, err := s.handler()
		if err != nil {
			return err
		}
		if srv, allowedHosts, err = s.a.httpServer(h); err != nil {
			return err
		}
		go func() { httpDone <- srv.Serve(ln) }()
	}

	svcDone := make(chan error, 1)
	go func() { svcDone <- s.svc.Run(runCtx) }()
	attrs := s.a.mode().runAttrs()
	if ln != nil {
		attrs = append(attrs, "http", ln.Addr().String(), "http_allowed_hosts", allowedHosts)
	}
	log.Info("ingest-worker running", attrs...)

	var runErr error
	select {
	case <-runCtx.Done():
		// Not ready from now on; the worker drains (nothing that did not
		// finish is acknowledged: docs/ARCHITECTURE.md §1.6).
		s.stopping.Store(true)
		log.Info("shutting down: running tasks get the grace period", "grace", s.a.cfg.ShutdownTimeout)
		runErr = <-svcDone
	case runErr = <-svcDone:
		// A component failed: the service stopped the others.
		s.stopping.Store(true)
	case err := <-httpDone:
		s.stopping.Store(true)
		runErr = fmt.Errorf("http server: %w", err)
		cancel()
		<-svcDone
	}
	if srv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("http server shutdown", "err", err)
		}
	}
	if runErr != nil {
		return runErr
	}
	log.Info("ingest-worker stopped")
	return nil
}
