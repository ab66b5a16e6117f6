package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// Service is one worker process: the task store, the worker (a consumer
// of the queue and its handlers), the outbox relay, the maintainer (the
// singleton services, while this process is the elected leader) and, in
// Redis mode, the reclaimer, sharing one Postgres pool and the queue.
type Service struct {
	cfg        Config
	store      *task.Store
	worker     *worker
	reclaimer  *reclaim.Reclaimer
	relay      *outbox.Relay
	maintainer *maintenance.Maintainer
	// awaiter serves Wait (its connection opens at the first Wait).
	awaiter *task.Awaiter
	log     *slog.Logger
	// closers run once every component has stopped (Kafka mode: the
	// relay's producer client).
	closers []func()
}

// NewService validates the configuration and builds every enabled
// component on queue (Redis or Kafka); errors name the setting. With the
// relay enabled, the store publishes the tasks it creates through it (see
// task.PublishWith: outbox.PublishAfterCommit, or outbox.PublishClaimed
// when there is no rescuer to republish what a crash between a commit and
// its publication leaves).
// logger may be nil (no logs); reg may be nil (no metrics exported).
func NewService(cfg Config, pool *pgxpool.Pool, queue Queue, logger *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if queue == nil {
		return nil, errors.New("ingest: NewService: nil queue (use Redis or Kafka)")
	}
	if pool == nil {
		return nil, errors.New("ingest: NewService: nil Postgres pool")
	}
	cfg, logger, err := prepare(queue, cfg, logger)
	if err != nil {
		return nil, err
	}
	svc := &Service{cfg: cfg, log: logger}
	if err := svc.build(pool, queue, reg); err != nil {
		svc.close()
		return nil, err
	}
	return svc, nil
}

// prepare is what every engine built on queue starts with: the queue's
// identity bound into cfg, the defaults, the validation, and a logger
// (discarding, when nil).
func prepare(queue Queue, cfg Config, logger *slog.Logger) (Config, *slog.Logger, error) {
	cfg, err := queue.bind(cfg)
	if err != nil {
		return cfg, nil, err
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return cfg, logger, nil
}

// build builds the components of s.cfg on queue, in dependency order.
func (s *Service) build(pool *pgxpool.Pool, queue Queue, reg prometheus.Registerer) error {
	cfg := s.cfg
	var opts []task.Option
	if !cfg.RelayDisabled {
		pub, closePub, err := queue.publisher(cfg)
		if err != nil {
			return err
		}
		if closePub != nil {
			s.closers = append(s.closers, closePub)
		}
		if s.relay, err = outbox.NewRelayWith(cfg.Relay, pool, pub, s.log, reg); err != nil {
			return err
		}
		// With a rescuer to republish what a crash between a commit and
		// its publication leaves, created tasks' outbox rows are written
		// once, SENT, after their publication.
		mode := outbox.PublishAfterCommit
		if cfg.Maintenance.RescuerDisabled {
			mode = outbox.PublishClaimed
		}
		opts = append(opts, task.PublishWith(outbox.NewWriter(s.relay, mode)))
	}
	var err error
	if s.store, err = task.NewStore(cfg.Store, pool, opts...); err != nil {
		return err
	}
	s.awaiter = task.NewAwaiter(s.store, s.log)
	s.closers = append(s.closers, s.awaiter.Close)
	if s.worker, err = queue.newWorker(cfg, s.store, pool, s.log, reg); err != nil {
		return err
	}
	if s.maintainer, err = maintenance.New(cfg.Maintenance, pool, queue.redis(), s.log, reg, maintenance.CreateWith(s.store)); err != nil {
		return err
	}
	return queue.attach(s, pool, s.log, reg)
}

// lossReportTimeout bounds one report of a Redis data loss.
const lossReportTimeout = 5 * time.Second

// reportLoss returns a hook that reports a Redis data loss (reason) to the
// leader without blocking its caller (see maintenance.ReportRedisLoss).
func (s *Service) reportLoss(reason string) func() {
	return func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), lossReportTimeout)
			defer cancel()
			if err := s.maintainer.ReportRedisLoss(ctx, s.cfg.Stream+": "+reason); err != nil {
				s.log.Warn("could not report the Redis data loss to the leader; its rescuer finds the lost tasks after its grace", "err", err)
			}
		}()
	}
}

// Config returns the configuration with defaults and the queue's identity
// filled in.
func (s *Service) Config() Config { return s.cfg }

// Store returns the service's task store: create tasks with it (also
// inside your own transaction, Store.CreateTx).
func (s *Service) Store() *task.Store { return s.store }

// Handle registers h for tasks of kind, replacing an earlier one. A task of
// a kind without a handler fails (and is retried: a later deploy may
// register it). Handlers may be registered while the service runs. It
// panics on an empty kind or a nil handler.
func (s *Service) Handle(kind string, h Handler) { s.HandleWith(kind, h, HandlerOptions{}) }

// HandleWith is Handle with options for the kind. It panics on an empty
// kind, a nil handler or invalid options.
func (s *Service) HandleWith(kind string, h Handler, opts HandlerOptions) {
	s.worker.handlers.handle(kind, h.fn(), opts)
}

// HandleResult is Handle for a handler that returns a result (see
// ResultHandler).
func (s *Service) HandleResult(kind string, h ResultHandler) {
	s.HandleResultWith(kind, h, HandlerOptions{})
}

// HandleResultWith is HandleWith for a handler that returns a result.
func (s *Service) HandleResultWith(kind string, h ResultHandler, opts HandlerOptions) {
	s.worker.handlers.handle(kind, h.fn(), opts)
}

// HandleDefault registers h for every kind without a handler of its own.
// It panics on a nil handler.
func (s *Service) HandleDefault(h Handler) { s.worker.handlers.handleDefault(h.fn()) }

// HandleDefaultResult is HandleDefault for a handler that returns a result
// (the binary's webhook handler serves all kinds this way).
func (s *Service) HandleDefaultResult(h ResultHandler) { s.worker.handlers.handleDefault(h.fn()) }

// Wait returns task id once it has ended (SUCCEEDED, DEAD or
// CANCELLED), woken by the notification of its end (task.Awaiter: one
// LISTEN connection for all of the service's waits, opened at the first
// and closed a minute after the last). When ctx ends first it returns the
// task as last read and ctx's error; task.ErrNotFound for an unknown id.
// It works whether or not the service runs.
func (s *Service) Wait(ctx context.Context, id uuid.UUID) (task.Task, error) {
	return s.awaiter.Wait(ctx, id)
}

// Ping checks that the queue's servers answer (Redis, or the Kafka
// brokers).
func (s *Service) Ping(ctx context.Context) error { return s.worker.ping(ctx) }

// Maintainer returns the service's maintainer (see maintenance.Maintainer:
// IsLeader tells whether this process runs the singleton services).
func (s *Service) Maintainer() *maintenance.Maintainer { return s.maintainer }

// Run runs every component until ctx is cancelled and returns when all have
// stopped. If one fails, the others are stopped and its error returned.
//
// Shutdown (ctx cancelled): all components see the cancellation at once.
// The reclaimer and relay finish their current pass (the relay still
// records what it published); the maintainer stops its services and, if
// it leads, resigns so that another process takes over at once; the
// worker stops reading and gives running handlers their grace period,
// handing back entries the reclaimer delivers meanwhile (see worker.run).
// Run returns once the worker has recorded the last outcomes.
func (s *Service) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	run := func(name string, f func(context.Context) error) {
		g.Go(func() error {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
	run("worker", s.worker.run)
	if s.reclaimer != nil {
		run("reclaimer", s.reclaimer.Run)
	}
	if s.relay != nil {
		run("outbox relay", s.relay.Run)
	}
	run("maintenance", s.maintainer.Run)
	err := g.Wait()
	s.close()
	return err
}

// close runs the closers.
func (s *Service) close() {
	for _, c := range s.closers {
		c()
	}
}
