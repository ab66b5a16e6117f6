package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/task"
)

// Test seams for the external test package.

type (
	RescueResult    = rescueResult
	RetentionResult = retentionResult
	Rescuer         = rescuer
	Retention       = retention
	Consumers       = consumers
)

// NewRescuer returns a rescuer outside any Maintainer (its passes are
// called directly), with its metrics on reg.
func NewRescuer(cfg RescuerConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, reg prometheus.Registerer) (*Rescuer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, false)
	if err != nil {
		return nil, err
	}
	return newRescuer(cfg, pool, rdb, m), nil
}

// RunOnce runs one rescuer pass.
func (r *rescuer) RunOnce(ctx context.Context) (RescueResult, error) { return r.runOnce(ctx) }

// NewRetention returns a retention outside any Maintainer.
func NewRetention(cfg RetentionConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, reg prometheus.Registerer) (*Retention, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, false)
	if err != nil {
		return nil, err
	}
	return newRetention(cfg, pool, rdb, m), nil
}

// RunOnce runs one retention pass.
func (r *retention) RunOnce(ctx context.Context) (RetentionResult, error) { return r.runOnce(ctx) }

// NewConsumers returns an idle-consumer cleanup outside any Maintainer.
func NewConsumers(cfg ConsumersConfig, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Consumers, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, true)
	if err != nil {
		return nil, err
	}
	return newConsumers(cfg, rdb, logger, m), nil
}

// RunOnce runs one cleanup pass and returns how many consumers it removed.
func (c *consumers) RunOnce(ctx context.Context) (int, error) { return c.runOnce(ctx) }

// Hooks are called when the services of m start under a new leadership,
// when they have all returned after it ended, and around each pass. Set
// them before Run.
type Hooks struct {
	Started, Stopped   func()
	PassBegin, PassEnd func(service string)
}

func SetHooks(m *Maintainer, h Hooks) {
	m.hooks = hooks{started: h.Started, stopped: h.Stopped, passBegin: h.PassBegin, passEnd: h.PassEnd}
}

// LeaderID is m's ingest_leader.leader_id.
func LeaderID(m *Maintainer) string { return m.elector.id }

// RunPass runs one pass of m's service name as the run loop does.
func RunPass(ctx context.Context, m *Maintainer, name string) {
	for _, s := range m.services {
		if s.name == name {
			m.runPass(ctx, s, m.logger)
			return
		}
	}
	panic("no service " + name)
}

// StartDelay and RunLoop expose the run loop's parts.
func StartDelay(interval time.Duration, jitter float64, rnd func() float64) time.Duration {
	return startDelay(interval, jitter, rnd)
}

func RunLoop(ctx context.Context, interval, delay time.Duration, runOnce func(context.Context)) {
	runLoop(ctx, interval, delay, runOnce, nil, nil)
}

// Services lists the names of m's services, in start order.
func Services(m *Maintainer) []string {
	var names []string
	for _, s := range m.services {
		names = append(names, s.name)
	}
	return names
}

// Periodic is the periodic service outside any Maintainer, on a clock of
// the test's.
type Periodic = periodic

func NewPeriodic(cfg PeriodicConfig, store *task.Store, now func() time.Time) (*Periodic, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(nil, false)
	if err != nil {
		return nil, err
	}
	p := newPeriodic(cfg, store, m)
	p.now = now
	return p, nil
}

// RunOnce runs one pass; Reset starts a new leadership.
func (p *periodic) RunOnce(ctx context.Context) (created, existing int, err error) {
	return p.runOnce(ctx)
}
func (p *periodic) Reset() { p.reset() }

// Releaser is the releaser of parked tasks, outside any Maintainer.
type Releaser = releaser

// NewReleaser returns a releaser on store with its metrics, and its
// ingest_kind_waiting_tasks collector, on reg.
func NewReleaser(cfg ReleaserConfig, store *task.Store, reg *prometheus.Registry) (*Releaser, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, false)
	if err != nil {
		return nil, err
	}
	r := newReleaser(cfg, store, slog.New(slog.DiscardHandler), m)
	return r, reg.Register(newWaitingCollector(r))
}

// RunOnce runs one releaser pass and returns how many tasks it released.
func (r *releaser) RunOnce(ctx context.Context) (int, error) { return r.runOnce(ctx) }

// SequenceCounter counts blocked sequences, outside any Maintainer.
type SequenceCounter = sequenceCounter

// NewSequenceCounter returns a counter on store, counting every interval,
// with its ingest_sequences_blocked collector on reg.
func NewSequenceCounter(interval time.Duration, store *task.Store, reg *prometheus.Registry) (*SequenceCounter, error) {
	m, err := newMetrics(reg, false)
	if err != nil {
		return nil, err
	}
	c := newSequenceCounter(interval, store, m)
	return c, reg.Register(newBlockedCollector(c))
}

// RunOnce takes one count.
func (c *sequenceCounter) RunOnce(ctx context.Context) error { return c.runOnce(ctx) }

// Partitions is the audit partitions' upkeep outside any Maintainer.
type (
	Partitions       = partitions
	PartitionsResult = partitionsResult
)

// NewPartitions returns the audit partitions' upkeep outside any
// Maintainer.
func NewPartitions(cfg PartitionsConfig, pool *pgxpool.Pool, reg prometheus.Registerer) (*Partitions, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, false)
	if err != nil {
		return nil, err
	}
	return newPartitions(cfg, pool, m), nil
}

// RunOnce runs one pass.
func (p *partitions) RunOnce(ctx context.Context) (PartitionsResult, error) { return p.runOnce(ctx) }

// LowWater is the raise of the low water outside any Maintainer.
type (
	LowWater       = lowWater
	LowWaterResult = lowWaterResult
)

// NewLowWater returns the raise of the low water outside any Maintainer.
func NewLowWater(cfg LowWaterConfig, pool *pgxpool.Pool, reg prometheus.Registerer) (*LowWater, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, false)
	if err != nil {
		return nil, err
	}
	return newLowWater(cfg, pool, m), nil
}

// RunOnce runs one pass.
func (w *lowWater) RunOnce(ctx context.Context) (LowWaterResult, error) { return w.runOnce(ctx) }

// RescuerService is the rescuer's name in the pass hooks.
const RescuerService = componentRescuer
