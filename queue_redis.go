package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/promreg"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Redis returns the queue of Redis mode: tasks travel through a stream
// (Config.Stream) read by a consumer group (Config.Group) on rdb; the
// reclaimer (Config.Reclaim) re-drives entries left pending, and the
// leader's rescuer and idle-consumer cleanup run on it too.
func Redis(rdb redis.UniversalClient) Queue { return &redisQueue{rdb: rdb} }

// redisQueue is the queue of Redis mode. consumer and sink are set by
// newWorker, for attach.
type redisQueue struct {
	rdb      redis.UniversalClient
	consumer *stream.Consumer
	sink     redisSink
}

func (q *redisQueue) bind(cfg Config) (Config, error) {
	if q.rdb == nil {
		return cfg, errors.New("ingest: Redis: nil redis client")
	}
	return cfg, nil
}

func (q *redisQueue) publisher(Config) (outbox.Publisher, func(), error) {
	return outbox.NewRedisPublisher(q.rdb), nil, nil
}

func (q *redisQueue) redis() redis.UniversalClient { return q.rdb }

func (q *redisQueue) newWorker(cfg Config, store *task.Store, _ *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*worker, error) {
	log := logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer)
	scfg := stream.Config{Stream: cfg.Stream, Group: cfg.Group, Consumer: cfg.Consumer, Block: cfg.Block, Count: cfg.ReadCount,
		HandBackIdle: cfg.ReclaimIdle}
	group, err := stream.NewGroup(scfg, q.rdb)
	if err != nil {
		return nil, err
	}
	dlqw, err := dlq.NewWriter(dlq.Config{Stream: cfg.Stream, Group: cfg.Group, DLQ: cfg.DLQ}, q.rdb)
	if err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	w, err := newWorkerWith(cfg, store, &redisTransport{group: group, dlq: dlqw, reclaimIdle: cfg.ReclaimIdle}, log, reg)
	if err != nil {
		return nil, err
	}
	// A second worker of the same stream in this process shares the first
	// one's collector.
	if _, err := promreg.Register[prometheus.Collector](reg, newStreamCollector(group, cfg.ReclaimIdle, log)); err != nil {
		return nil, err
	}
	q.sink = redisSink{w.proc}
	if q.consumer, err = stream.NewConsumer(scfg, q.rdb, q.sink, logger); err != nil {
		return nil, err
	}
	w.consume = q.consumer.Run
	w.ping = func(ctx context.Context) error { return q.rdb.Ping(ctx).Err() }
	return w, nil
}

// attach builds the reclaimer feeding the worker (unless
// Config.ReclaimDisabled), and sends the evidence that Redis lost data
// (a consumer group found missing) to the leader's rescuer at once.
func (q *redisQueue) attach(s *Service, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) error {
	if !s.cfg.ReclaimDisabled {
		var err error
		if s.reclaimer, err = reclaim.New(s.cfg.Reclaim, q.rdb, pool, q.sink, logger, reg); err != nil {
			return err
		}
		s.reclaimer.OnGroupLost(s.reportLoss("a reclaim round found the consumer group missing (NOGROUP)"))
	}
	q.consumer.OnGroupLost(s.reportLoss("a read found the consumer group missing (NOGROUP)"))
	return nil
}

// redisDelivery parses a stream entry.
func redisDelivery(m redis.XMessage, now time.Time) delivery {
	d := delivery{id: m.ID, received: now, kind: stream.FieldString(m, stream.FieldKind),
		rawTaskID: stream.FieldString(m, stream.FieldTaskID)}
	e, err := stream.ParseEntry(m)
	switch {
	case errors.Is(err, stream.ErrDeleted):
		d.deleted = true
	case err != nil:
		d.err = err
		d.kind = e.Kind
	default:
		d.taskID, d.kind, d.traceparent = e.TaskID, e.Kind, e.Traceparent
	}
	return d
}

// redisSink adapts the processor to stream.Sink, for the consumer and the
// reclaimer.
type redisSink struct{ *processor }

// Process implements stream.Sink (see processor.process).
func (s redisSink) Process(ctx context.Context, msgs []redis.XMessage, reserved int) {
	now := time.Now()
	ds := make([]delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = redisDelivery(m, now)
	}
	s.process(ctx, ds, reserved)
}

// redisTransport settles stream entries of the consumer group. A deferred
// entry stays pending with an idle time that makes the reclaimer claim it
// at its time (docs/ARCHITECTURE.md §2.5).
type redisTransport struct {
	group       *stream.Group
	dlq         *dlq.Writer
	reclaimIdle time.Duration
}

func (t *redisTransport) settle(ctx context.Context, acks []string, later []deferral) error {
	now := time.Now()
	idles := make([]stream.Idle, len(later))
	for i, d := range later {
		idles[i] = stream.Idle{ID: d.id, Idle: t.idleUntil(d.at, now)}
	}
	return t.group.Apply(ctx, acks, idles)
}

// idleUntil returns the idle time that makes an entry claimable by the
// reclaimer (min-idle reclaimIdle) at at: reclaimIdle - (at - now), clamped
// to [0, reclaimIdle].
func (t *redisTransport) idleUntil(at, now time.Time) time.Duration {
	return max(0, min(t.reclaimIdle-at.Sub(now), t.reclaimIdle))
}

func (t *redisTransport) deadLetter(ctx context.Context, e dlq.Entry) (bool, error) {
	id, err := t.dlq.Write(ctx, e)
	return id != "", err
}

// redelivers: a pending entry is claimed again once idle (the reclaimer).
func (t *redisTransport) redelivers() bool { return true }

func (t *redisTransport) touch(ctx context.Context, ids []string) error {
	return t.group.Touch(ctx, ids...)
}

// handBack makes entries claimable at once by another worker.
func (t *redisTransport) handBack(ctx context.Context, ids []string) error {
	return t.group.SetIdle(ctx, t.reclaimIdle, ids...)
}

// abandon hands entries to this consumer's stream.AbandonedConsumer: silent
// from now on, so other workers' reclaimers take their tasks over once
// the leases expire (package reclaim), while this worker's reclaimer takes
// them only after the reclaim idle time, and leaves them alone anyway
// while they are in flight here.
func (t *redisTransport) abandon(ctx context.Context, ids []string) error {
	return t.group.Abandon(ctx, ids...)
}

// streamCollector reads ingest_stream_length, ingest_stream_pending and
// ingest_stream_pending_overdue_seconds from Redis at scrape time, one
// series of each per priority stream (label stream: stream.Keys).
type streamCollector struct {
	g           *stream.Group
	reclaimIdle time.Duration
	log         *slog.Logger
	length      *prometheus.Desc
	pending     *prometheus.Desc
	overdue     *prometheus.Desc
}

// overdueScan is how many overdue pending entries one scrape looks at.
const overdueScan = 100

// collectTimeout bounds the Redis calls of one scrape.
const collectTimeout = 2 * time.Second

func newStreamCollector(g *stream.Group, reclaimIdle time.Duration, log *slog.Logger) *streamCollector {
	cfg := g.Config()
	return &streamCollector{
		g:           g,
		reclaimIdle: reclaimIdle,
		log:         log,
		length: prometheus.NewDesc("ingest_stream_length", "Entries in the task stream (XLEN), per priority stream.",
			[]string{"stream"}, nil),
		pending: prometheus.NewDesc("ingest_stream_pending", "Entries delivered and not yet acknowledged (XPENDING), per priority stream.",
			[]string{"stream"}, prometheus.Labels{"group": cfg.Group}),
		overdue: prometheus.NewDesc("ingest_stream_pending_overdue_seconds",
			fmt.Sprintf("How long the most overdue pending entry has been idle beyond the reclaim idle time (0: none), per priority stream; a lower bound when more than %d are overdue.", overdueScan),
			[]string{"stream"}, prometheus.Labels{"group": cfg.Group}),
	}
}

func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.length
	ch <- c.pending
	ch <- c.overdue
}

// Collect leaves out what Redis does not answer: a failed read of these
// gauges must not fail the others.
func (c *streamCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	for _, key := range stream.Keys(c.g.Config().Stream) {
		length, pending, err := c.g.StatsOf(ctx, key)
		if err != nil {
			c.log.Warn("read stream metrics failed", "stream", key, "err", err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.length, prometheus.GaugeValue, float64(length), key)
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(pending), key)
		overdue, err := c.g.OverdueOf(ctx, key, c.reclaimIdle, overdueScan)
		if err != nil {
			c.log.Warn("read overdue pending entries failed", "stream", key, "err", err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, overdue.Seconds(), key)
	}
}
