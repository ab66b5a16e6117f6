package ingest

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// ServiceConfig configures a Service: one worker process.
//
// The queue's identity is set once, in Worker: the stream, the group, the
// consumer name and the reclaim idle time. Every other component's copy of
// those facts is derived from it (see WithDefaults): a derived field left
// zero takes Worker's value, and one set to another value is refused by
// Validate, naming both fields. Nothing is overwritten behind the caller's
// back.
type ServiceConfig struct {
	// Store configures the task store the service creates (Service.Store).
	// Derived: Stream.
	Store task.Config

	// Worker configures the consumer and its handlers, and holds the
	// queue's identity.
	Worker Config

	// Reclaim configures the reclaimer; ReclaimDisabled runs none
	// (INGEST_REDIS_RECLAIM_ENABLED=false). Derived: Stream, Group,
	// Consumer, MinIdle (Worker.ReclaimIdle), LeaseIdle (Worker.TaskLease).
	Reclaim         reclaim.Config
	ReclaimDisabled bool

	// Relay configures the outbox relay; RelayDisabled runs none. ID
	// defaults to the consumer name.
	Relay         outbox.RelayConfig
	RelayDisabled bool

	// Maintenance configures the leader election and the singleton
	// services only the leader runs. Derived: Rescuer.Stream and .Group,
	// Retention.Streams (Worker's stream), Consumers.Stream, .Group and
	// .Consumer. Elector.ID defaults to the consumer name.
	Maintenance maintenance.Config

	// Listen says where the connections that LISTEN come from: the
	// relay's, the cancel listener's (Store.Listen) and the leader's loss
	// listener's (Maintenance.Listen); each of those left zero takes it.
	// The zero value opens them like the pool's connections; behind a
	// transaction pooler set Listen.Conn to a direct connection, or
	// Listen.None to poll instead (package pgsession).
	Listen pgsession.Source
}

// WithDefaults returns the configuration with every zero field set to its
// default and every zero derived field set to Worker's value.
func (c ServiceConfig) WithDefaults() ServiceConfig {
	c.Worker = c.Worker.WithDefaults()
	w := c.Worker
	c.Store.Stream = cmp.Or(c.Store.Stream, w.Stream)
	c.Store.Listen = cmp.Or(c.Store.Listen, c.Listen)
	c.Relay.Listen = cmp.Or(c.Relay.Listen, c.Listen)
	c.Maintenance.Listen = cmp.Or(c.Maintenance.Listen, c.Listen)
	c.Store = c.Store.WithDefaults()

	c.Reclaim.Stream = cmp.Or(c.Reclaim.Stream, w.Stream)
	c.Reclaim.Group = cmp.Or(c.Reclaim.Group, w.Group)
	c.Reclaim.Consumer = cmp.Or(c.Reclaim.Consumer, w.Consumer)
	c.Reclaim.MinIdle = cmp.Or(c.Reclaim.MinIdle, w.ReclaimIdle)
	c.Reclaim.LeaseIdle = cmp.Or(c.Reclaim.LeaseIdle, w.TaskLease)
	c.Reclaim = c.Reclaim.WithDefaults()

	c.Relay.ID = cmp.Or(c.Relay.ID, w.Consumer)
	c.Relay = c.Relay.WithDefaults()

	m := &c.Maintenance
	m.Rescuer.Stream = cmp.Or(m.Rescuer.Stream, w.Stream)
	m.Rescuer.Group = cmp.Or(m.Rescuer.Group, w.Group)
	if len(m.Retention.Streams) == 0 {
		m.Retention.Streams = []string{w.Stream}
	}
	m.Retention.DLQ = cmp.Or(m.Retention.DLQ, w.DLQ) // entries of deleted DEAD tasks
	m.Consumers.Stream = cmp.Or(m.Consumers.Stream, w.Stream)
	m.Consumers.Group = cmp.Or(m.Consumers.Group, w.Group)
	m.Consumers.Consumer = cmp.Or(m.Consumers.Consumer, w.Consumer)
	m.Elector.ID = cmp.Or(m.Elector.ID, w.Consumer)
	c.Maintenance = c.Maintenance.WithDefaults()
	return c
}

// Validate checks the configuration, zero fields taking their defaults:
// every derived field agrees with Worker, and every enabled component's
// configuration is valid. Errors name the field.
func (c ServiceConfig) Validate() error {
	c = c.WithDefaults()
	w := c.Worker
	type derived struct {
		field, got, worker, want string
	}
	checks := []derived{
		{"Store.Stream", c.Store.Stream, "Stream", w.Stream},
		{"Maintenance.Rescuer.Stream", c.Maintenance.Rescuer.Stream, "Stream", w.Stream},
		{"Maintenance.Rescuer.Group", c.Maintenance.Rescuer.Group, "Group", w.Group},
		{"Maintenance.Consumers.Stream", c.Maintenance.Consumers.Stream, "Stream", w.Stream},
		{"Maintenance.Consumers.Group", c.Maintenance.Consumers.Group, "Group", w.Group},
		{"Maintenance.Consumers.Consumer", c.Maintenance.Consumers.Consumer, "Consumer", w.Consumer},
	}
	if !c.ReclaimDisabled {
		checks = append(checks,
			derived{"Reclaim.Stream", c.Reclaim.Stream, "Stream", w.Stream},
			derived{"Reclaim.Group", c.Reclaim.Group, "Group", w.Group},
			derived{"Reclaim.Consumer", c.Reclaim.Consumer, "Consumer", w.Consumer},
			derived{"Reclaim.MinIdle", c.Reclaim.MinIdle.String(), "ReclaimIdle", w.ReclaimIdle.String()},
			derived{"Reclaim.LeaseIdle", c.Reclaim.LeaseIdle.String(), "TaskLease", w.TaskLease.String()})
	}
	for field, l := range map[string]pgsession.Source{"Store.Listen": c.Store.Listen, "Relay.Listen": c.Relay.Listen, "Maintenance.Listen": c.Maintenance.Listen} {
		if l != c.Listen {
			return fmt.Errorf("ingest: ServiceConfig.%s differs from ServiceConfig.Listen: set Listen only (leave %s zero)", field, field)
		}
	}
	for _, d := range checks {
		if d.got != d.want {
			return fmt.Errorf("ingest: ServiceConfig.%s is %q but Worker.%s is %q: set it in Worker only (leave %s zero)", d.field, d.got, d.worker, d.want, d.field)
		}
	}
	if err := w.Validate(); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	if err := c.Store.Validate(); err != nil {
		return fmt.Errorf("task store config: %w", err)
	}
	if !c.ReclaimDisabled {
		if err := c.Reclaim.Validate(); err != nil {
			return fmt.Errorf("reclaim config: %w", err)
		}
	}
	if !c.RelayDisabled {
		if err := c.Relay.Validate(); err != nil {
			return err
		}
	}
	return c.Maintenance.Validate()
}

// Service is one worker process: the task store, the consumer and its
// handlers, the reclaimer, the outbox relay and the maintainer (the
// singleton services, while this process is the elected leader), sharing
// one Postgres pool and one Redis client.
type Service struct {
	cfg        ServiceConfig
	store      *task.Store
	worker     *Worker
	reclaimer  *reclaim.Reclaimer
	relay      *outbox.Relay
	maintainer *maintenance.Maintainer
	log        *slog.Logger
	// closers run once every component has stopped (Kafka mode: the
	// relay's producer client).
	closers []func()
}

// NewService validates the configuration and builds every enabled
// component; errors name the component and the field. With the relay
// enabled, the store publishes the tasks it creates through it (see
// task.PublishWith: outbox.PublishAfterCommit, or outbox.PublishClaimed
// when the rescuer is disabled).
func NewService(cfg ServiceConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Service, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	svc := &Service{cfg: cfg, log: logger}
	var err error
	var opts []task.Option
	if !cfg.RelayDisabled {
		if svc.relay, err = outbox.NewRelay(cfg.Relay, pool, rdb, logger, reg); err != nil {
			return nil, err
		}
		// With a rescuer to republish what a crash between a commit
		// and its XADD leaves, created tasks' outbox rows are written
		// once, SENT, after their XADD.
		mode := outbox.PublishAfterCommit
		if cfg.Maintenance.RescuerDisabled {
			mode = outbox.PublishClaimed
		}
		opts = append(opts, task.PublishWith(outbox.NewWriter(svc.relay, mode)))
	}
	if svc.store, err = task.NewStore(cfg.Store, pool, opts...); err != nil {
		return nil, fmt.Errorf("task store config: %w", err)
	}
	if svc.worker, err = New(cfg.Worker, svc.store, rdb, logger, reg); err != nil {
		return nil, err
	}
	if !cfg.ReclaimDisabled {
		if svc.reclaimer, err = reclaim.New(cfg.Reclaim, rdb, pool, svc.worker.Sink(), logger, reg); err != nil {
			return nil, err
		}
	}
	if svc.maintainer, err = maintenance.New(cfg.Maintenance, pool, rdb, logger, reg, maintenance.CreateWith(svc.store)); err != nil {
		return nil, err
	}
	// Evidence that Redis lost data goes to the leader's rescuer at once.
	if svc.worker.stream != nil {
		svc.worker.stream.OnGroupLost(svc.reportLoss("a read found the consumer group missing (NOGROUP)"))
	}
	if svc.reclaimer != nil {
		svc.reclaimer.OnGroupLost(svc.reportLoss("a reclaim round found the consumer group missing (NOGROUP)"))
	}
	return svc, nil
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
			if err := s.maintainer.ReportRedisLoss(ctx, s.cfg.Worker.Stream+": "+reason); err != nil {
				s.log.Warn("could not report the Redis data loss to the leader; its rescuer finds the lost tasks after its grace", "err", err)
			}
		}()
	}
}

// Config returns the configuration with defaults and derived fields filled
// in.
func (s *Service) Config() ServiceConfig { return s.cfg }

// Store returns the service's task store: create tasks with it (also
// inside your own transaction, Store.CreateTx).
func (s *Service) Store() *task.Store { return s.store }

// Handle registers the handler of a task kind (see Worker.Handle).
func (s *Service) Handle(kind string, h Handler) { s.worker.Handle(kind, h) }

// HandleWith registers the handler of a task kind with options (see
// Worker.HandleWith).
func (s *Service) HandleWith(kind string, h Handler, opts HandlerOptions) {
	s.worker.HandleWith(kind, h, opts)
}

// HandleDefault registers the handler of every kind without one of its own
// (see Worker.HandleDefault).
func (s *Service) HandleDefault(h Handler) { s.worker.HandleDefault(h) }

// Worker returns the service's worker.
func (s *Service) Worker() *Worker { return s.worker }

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
// handing back entries the reclaimer delivers meanwhile (see Worker.Run).
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
	run("worker", s.worker.Run)
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
