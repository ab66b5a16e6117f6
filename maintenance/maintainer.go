package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/promreg"
	"github.com/ingest-worker/ingest/task"
)

// startJitter is the fraction of its interval a service waits, at random,
// before its first pass (see loop).
const startJitter = 1.0

// errDeadline: the local deadline passed without a successful renewal.
var errDeadline = errors.New("the lease was not renewed before the local deadline")

// errShutdown: Run's context ended.
var errShutdown = errors.New("shutting down")

// service is one singleton service: while the process leads, the
// Maintainer runs its passes in a loop (see loop).
type service struct {
	name     string // for logs
	interval time.Duration
	// pass runs one pass and returns what it did as log attributes (nil:
	// nothing worth a line) and why it failed.
	pass func(ctx context.Context) (did []any, err error)
	// msg and level are those of the line logged for a pass that did
	// something.
	msg   string
	level slog.Level
	// failed counts a failed pass.
	failed func()
	// start, when set, is called each time the service starts under a new
	// leadership, before its first pass.
	start func()
	// kick, when set, asks for an urgent pass, logged with urgentMsg at
	// Warn (see loop).
	kick      chan struct{}
	urgent    func(ctx context.Context) (did []any, err error)
	urgentMsg string
}

// hooks are test seams, called when the services start under a new
// leadership, when all of them have returned after it ended, and around
// each pass. Nil hooks are not called.
type hooks struct {
	started, stopped func()
	passBegin        func(service string)
	passEnd          func(service string)
}

// Maintainer runs the singleton services (rescuer, retention, idle-consumer
// cleanup, periodic tasks) on exactly one process of those sharing a database: the one
// elected leader. See the package documentation.
type Maintainer struct {
	cfg      Config
	pool     *pgxpool.Pool
	logger   *slog.Logger
	elector  *elector
	services []*service
	metrics  *metrics
	leader   atomic.Bool
	hooks    hooks
}

// New returns a Maintainer for the enabled services of cfg, after
// validating it (errors wrap ErrConfig and name the field). The pool is
// required; the Redis client too, unless every service that uses Redis is
// disabled. Its metrics are registered on reg (nil: none).
//
// The periodic service and the releaser use the task store given by
// CreateWith, else a task store of their own on pool writing to
// Rescuer.Stream.
func New(cfg Config, pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer, opts ...Option) (*Maintainer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	usesRedis := !cfg.RescuerDisabled || !cfg.ConsumersDisabled || (!cfg.RetentionDisabled && (!cfg.Retention.DisableTrim || cfg.Retention.DLQ != ""))
	switch {
	case pool == nil:
		return nil, configErr("pool", "is required (a Postgres pool)")
	case rdb == nil && usesRedis:
		return nil, configErr("rdb", "is required (a Redis client) unless the rescuer, the idle-consumer cleanup, stream trimming and the DLQ removal of retention are disabled")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg, !cfg.ConsumersDisabled)
	if err != nil {
		return nil, err
	}
	e, err := newElector(cfg.Elector, pool)
	if err != nil {
		return nil, err
	}
	mt := &Maintainer{cfg: cfg, pool: pool, elector: e, metrics: m,
		logger: logger.With("component", "maintenance", "leader_id", e.id)}
	if !cfg.RescuerDisabled {
		mt.services = append(mt.services, newRescuer(cfg.Rescuer, pool, rdb, m).service())
	}
	if !cfg.RetentionDisabled {
		mt.services = append(mt.services, newRetention(cfg.Retention, pool, rdb, m).service())
	}
	if !cfg.PartitionsDisabled {
		mt.services = append(mt.services, newPartitions(cfg.Partitions, pool, m).service())
	}
	if !cfg.LowWaterDisabled {
		mt.services = append(mt.services, newLowWater(cfg.LowWater, pool, m).service())
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.store == nil && (len(cfg.Periodic.Schedules) > 0 || !cfg.ReleaserDisabled) {
		if o.store, err = task.NewStore(task.Config{Stream: cfg.Rescuer.Stream}, pool); err != nil {
			return nil, err
		}
	}
	if len(cfg.Periodic.Schedules) > 0 {
		mt.services = append(mt.services, newPeriodic(cfg.Periodic, o.store, m).service())
	}
	if !cfg.ReleaserDisabled {
		r := newReleaser(cfg.Releaser, o.store, mt.logger.With("service", componentReleaser), m)
		if _, err := promreg.Register[prometheus.Collector](reg, newWaitingCollector(r)); err != nil {
			return nil, err
		}
		mt.services = append(mt.services, r.service())
		sc := newSequenceCounter(cfg.Releaser.WaitingInterval, o.store, m)
		if _, err := promreg.Register[prometheus.Collector](reg, newBlockedCollector(sc)); err != nil {
			return nil, err
		}
		mt.services = append(mt.services, sc.service())
	}
	if !cfg.ConsumersDisabled {
		c := cfg.Consumers
		mt.services = append(mt.services, newConsumers(c, rdb, mt.logger.With("stream", c.Stream, "group", c.Group), m).service())
	}
	m.leader.WithLabelValues(cfg.Elector.Name).Set(0)
	return mt, nil
}

// Option changes how New builds a Maintainer.
type Option func(*options)

type options struct {
	store *task.Store
}

// CreateWith makes the periodic service create its tasks, and the
// releaser release parked tasks, with store (a Service passes its own,
// which publishes through its relay).
func CreateWith(store *task.Store) Option { return func(o *options) { o.store = store } }

// Config returns the configuration with defaults filled in.
func (m *Maintainer) Config() Config { return m.cfg }

// IsLeader reports whether this Maintainer leads now, i.e. runs (or is
// starting, or is about to stop) the services.
func (m *Maintainer) IsLeader() bool { return m.leader.Load() }

func (m *Maintainer) setLeader(on bool) {
	m.leader.Store(on)
	v := 0.0
	if on {
		v = 1
	}
	m.metrics.leader.WithLabelValues(m.cfg.Elector.Name).Set(v)
}

// Run takes part in the election until ctx is cancelled, running the
// services while this process leads, and returns nil then. With no
// service enabled it only waits for ctx.
//
// A follower tries to become leader every RetryInterval. The leader renews
// its lease every RenewInterval; when a renewal fails, finds another
// leader, or does not succeed before the local deadline, it cancels its
// services at once (before any other process can be elected) and waits
// for them to return before it takes part again. On shutdown the leader
// stops its services first and then deletes its leader row, so that a
// follower takes over at its next attempt.
func (m *Maintainer) Run(ctx context.Context) error {
	if len(m.services) == 0 {
		<-ctx.Done()
		return nil
	}
	failing := false
	for {
		deadline, ok, err := m.elector.acquire(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err != nil && !failing:
			failing = true
			m.logger.Warn("leader election: acquire failed; retrying every RetryInterval", "err", err, "retry_interval", m.cfg.Elector.RetryInterval)
		case err != nil:
			m.logger.Debug("leader election: still failing", "err", err)
		case ok && time.Now().Before(deadline):
			failing = false
			m.lead(ctx, deadline)
			if ctx.Err() != nil {
				return nil
			}
			continue // at once: a lease lost to an error may still be ours
		default:
			failing = false
		}
		t := time.NewTimer(m.cfg.Elector.RetryInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// lead runs the services while the leadership lasts, from an acquire whose
// local deadline is deadline, and returns once they have all stopped (and,
// when ctx ended, the leadership is resigned).
func (m *Maintainer) lead(ctx context.Context, deadline time.Time) {
	svcCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// The watchdog stops the services at the local deadline even while a
	// renewal is still waiting for an answer.
	watchdog := time.AfterFunc(time.Until(deadline), func() { stop(errDeadline) })
	defer watchdog.Stop()

	m.setLeader(true)
	m.logger.Info("elected leader: starting the maintenance services")
	if m.hooks.started != nil {
		m.hooks.started()
	}
	var wg sync.WaitGroup
	for _, s := range m.services {
		wg.Go(func() { m.runService(svcCtx, s) })
		if s.kick != nil {
			wg.Go(func() { m.listenLoss(svcCtx, s.kick) })
		}
	}

	reason := m.renewUntilLost(svcCtx, deadline, watchdog)
	if ctx.Err() != nil {
		reason = errShutdown
	}
	stop(reason)
	m.setLeader(false)
	wg.Wait()
	if m.hooks.stopped != nil {
		m.hooks.stopped()
	}
	if ctx.Err() == nil {
		m.logger.Warn("lost the leadership: maintenance services stopped", "err", reason)
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.Elector.TTL)
	defer cancel()
	if err := m.elector.resign(rctx); err != nil {
		m.logger.Warn("could not resign the leadership: a follower takes over when the lease expires", "err", err)
		return
	}
	m.logger.Info("resigned the leadership: maintenance services stopped")
}

// renewUntilLost renews the lease every RenewInterval, moving the
// watchdog to each new local deadline, until a renewal fails or ctx ends;
// it returns why.
func (m *Maintainer) renewUntilLost(ctx context.Context, deadline time.Time, watchdog *time.Timer) error {
	ticker := time.NewTicker(m.cfg.Elector.RenewInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ticker.C:
		}
		next, err := m.elector.renew(ctx, deadline)
		if err != nil {
			if cause := context.Cause(ctx); cause != nil {
				return cause
			}
			return err
		}
		if !watchdog.Stop() {
			return errDeadline // it fired while the renewal was under way
		}
		deadline = next
		watchdog.Reset(time.Until(deadline))
	}
}

// runService runs the passes of s until ctx ends (see loop and runPass).
func (m *Maintainer) runService(ctx context.Context, s *service) {
	logger := m.logger.With("service", s.name)
	if s.start != nil {
		s.start()
	}
	urgent := *s
	urgent.pass, urgent.msg, urgent.level = s.urgent, s.urgentMsg, slog.LevelWarn
	loop(ctx, s.interval, startJitter, func(ctx context.Context) { m.runPass(ctx, s, logger) },
		s.kick, func(ctx context.Context) { m.runPass(ctx, &urgent, logger) })
}

// runPass runs one pass of s: a failed pass is counted and logged, a pass
// that did something is logged, others are silent.
func (m *Maintainer) runPass(ctx context.Context, s *service, logger *slog.Logger) {
	if m.hooks.passBegin != nil {
		m.hooks.passBegin(s.name)
	}
	did, err := s.pass(ctx)
	if m.hooks.passEnd != nil {
		m.hooks.passEnd(s.name)
	}
	if err != nil && ctx.Err() == nil {
		s.failed()
		logger.Error("maintenance pass failed", "err", err)
	}
	if did != nil {
		logger.Log(ctx, s.level, s.msg, did...)
	}
}
