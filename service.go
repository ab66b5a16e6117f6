package ingest

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// ServiceConfig configures a Service. The stream, group, consumer name and
// reclaim idle time of Worker are the single source for every component:
// the reclaimer, rescuer and retention take theirs from it.
type ServiceConfig struct {
	Worker Config

	// Reclaim configures the reclaimer (Stream, Group, Consumer and MinIdle
	// are taken from Worker). ReclaimDisabled runs none
	// (INGEST_REDIS_RECLAIM_ENABLED=false).
	Reclaim         reclaim.Config
	ReclaimDisabled bool

	// Relay configures the outbox relay (ID defaults to the consumer name).
	Relay         outbox.RelayConfig
	RelayDisabled bool

	// Rescuer configures the rescuer (Stream and Group from Worker).
	Rescuer         outbox.RescuerConfig
	RescuerDisabled bool

	// Retention configures outbox retention and stream trimming (Streams
	// default to Worker's stream).
	Retention         outbox.RetentionConfig
	RetentionDisabled bool
}

// Service is one worker process: the consumer and its handlers, the
// reclaimer, the outbox relay, the rescuer and retention, sharing one
// Postgres pool and one Redis client.
type Service struct {
	worker    *Worker
	reclaimer *reclaim.Reclaimer
	relay     *outbox.Relay
	rescuer   *outbox.Rescuer
	retention *outbox.Retention
	log       *slog.Logger
}

// NewService builds every enabled component and validates their
// configuration; errors name the component and the field. With the relay
// enabled, the store publishes the tasks it creates through it (see
// task.Store.PublishThrough).
func NewService(cfg ServiceConfig, store *task.Store, pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	w, err := New(cfg.Worker, store, rdb, logger, reg)
	if err != nil {
		return nil, err
	}
	wc := w.Config()
	if s := store.Config().Stream; s != wc.Stream {
		return nil, fmt.Errorf("ingest: the task store publishes new tasks to stream %q but the worker consumes %q: configure one stream", s, wc.Stream)
	}
	svc := &Service{worker: w, log: logger}

	if !cfg.ReclaimDisabled {
		rc := cfg.Reclaim
		rc.Stream, rc.Group, rc.Consumer, rc.MinIdle = wc.Stream, wc.Group, wc.Consumer, wc.ReclaimIdle
		if svc.reclaimer, err = reclaim.New(rc, rdb, pool, w.Sink(), logger, reg); err != nil {
			return nil, err
		}
	}
	if !cfg.RelayDisabled {
		rc := cfg.Relay
		if rc.ID == "" {
			rc.ID = wc.Consumer
		}
		if svc.relay, err = outbox.NewRelay(rc, pool, rdb, logger, reg); err != nil {
			return nil, err
		}
		// Tasks the store creates are handed to the relay on commit
		// while the service runs (see task.Store.PublishThrough).
		store.PublishThrough(svc.relay)
	}
	if !cfg.RescuerDisabled {
		rc := cfg.Rescuer
		rc.Stream, rc.Group = wc.Stream, wc.Group
		if svc.rescuer, err = outbox.NewRescuer(rc, pool, rdb, logger, reg); err != nil {
			return nil, err
		}
	}
	if !cfg.RetentionDisabled {
		rc := cfg.Retention
		if len(rc.Streams) == 0 {
			rc.Streams = []string{wc.Stream}
		}
		if svc.retention, err = outbox.NewRetention(rc, pool, rdb, logger, reg); err != nil {
			return nil, err
		}
	}
	return svc, nil
}

// Handle registers the handler of a task kind (see Worker.Handle).
func (s *Service) Handle(kind string, h Handler) { s.worker.Handle(kind, h) }

// HandleDefault registers the handler of every kind without one of its own
// (see Worker.HandleDefault).
func (s *Service) HandleDefault(h Handler) { s.worker.HandleDefault(h) }

// Worker returns the service's worker.
func (s *Service) Worker() *Worker { return s.worker }

// Run runs every component until ctx is cancelled and returns when all have
// stopped. If one fails, the others are stopped and its error returned.
//
// Shutdown (ctx cancelled): all components see the cancellation at once.
// The reclaimer, relay, rescuer and retention finish their current pass
// (the relay still records what it published); the worker stops reading
// and gives running handlers their grace period, handing back entries the
// reclaimer delivers meanwhile (see Worker.Run). Run returns once the
// worker has recorded the last outcomes.
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
	run("worker", s.worker.Run)
	if s.reclaimer != nil {
		run("reclaimer", s.reclaimer.Run)
	}
	if s.relay != nil {
		run("outbox relay", s.relay.Run)
	}
	if s.rescuer != nil {
		run("outbox rescuer", s.rescuer.Run)
	}
	if s.retention != nil {
		run("outbox retention", s.retention.Run)
	}
	return g.Wait()
}
