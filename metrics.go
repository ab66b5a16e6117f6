package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/promreg"
	"github.com/ingest-worker/ingest/stream"
)

// Values of the result label (docs/ARCHITECTURE.md §6).
const (
	resultSucceeded = "succeeded"
	resultRetry     = "retry"
	resultDead      = "dead"
	resultSkipped   = "skipped"
	resultNotDue    = "not_due"
	resultConflict  = "conflict"
	resultReleased  = "released" // handed back at shutdown
	resultPoison    = "poison"   // no valid task_id: dead-lettered
	resultCancelled = "cancelled"
	resultPaused    = "paused"    // its kind is paused: parked until resumed
	resultThrottled = "throttled" // its kind is at a limit: parked (or looked at again) until a slot or start frees
)

var results = []string{resultSucceeded, resultRetry, resultDead, resultSkipped, resultNotDue, resultConflict, resultReleased, resultPoison, resultCancelled, resultPaused, resultThrottled}

// metrics are the worker's Prometheus metrics.
type metrics struct {
	total   *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	dlq     prometheus.Counter
	// throttled counts the starts a kind's limit held back, by kind.
	throttled *prometheus.CounterVec
}

// newMetrics registers the worker metrics, and the stream gauges when g
// is not nil.
func newMetrics(reg prometheus.Registerer, g *stream.Group, reclaimIdle time.Duration, log *slog.Logger) (*metrics, error) {
	m := &metrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ingest_task_process_total",
			Help: "Stream entries processed, by result.",
		}, []string{"result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ingest_task_process_seconds",
			Help:    "Time from delivery of a stream entry to its settled outcome, by result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"result"}),
		dlq: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ingest_task_dlq_total",
			Help: "Entries written to the dead-letter stream.",
		}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ingest_kind_throttled_total",
			Help: "Tasks whose start their kind's concurrency or rate limit held back (they wait parked), by kind.",
		}, []string{"kind"}),
	}
	var err error
	if m.total, err = promreg.Register(reg, m.total); err != nil {
		return nil, err
	}
	if m.seconds, err = promreg.Register(reg, m.seconds); err != nil {
		return nil, err
	}
	if m.dlq, err = promreg.Register(reg, m.dlq); err != nil {
		return nil, err
	}
	if m.throttled, err = promreg.Register(reg, m.throttled); err != nil {
		return nil, err
	}
	for _, r := range results {
		m.total.WithLabelValues(r)
	}
	if g == nil {
		return m, nil // Kafka mode: no stream to read
	}
	// A second worker of the same stream in this process shares the first
	// one's collector.
	if _, err := promreg.Register[prometheus.Collector](reg, newStreamCollector(g, reclaimIdle, log)); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) observe(result string, since time.Time) {
	if result == "" {
		return
	}
	m.total.WithLabelValues(result).Inc()
	m.seconds.WithLabelValues(result).Observe(time.Since(since).Seconds())
}

// streamCollector reads ingest_stream_length, ingest_stream_pending and
// ingest_stream_pending_overdue_seconds from Redis at scrape time.
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
		length: prometheus.NewDesc("ingest_stream_length", "Entries in the task stream (XLEN).",
			nil, prometheus.Labels{"stream": cfg.Stream}),
		pending: prometheus.NewDesc("ingest_stream_pending", "Entries delivered and not yet acknowledged (XPENDING).",
			nil, prometheus.Labels{"stream": cfg.Stream, "group": cfg.Group}),
		overdue: prometheus.NewDesc("ingest_stream_pending_overdue_seconds",
			fmt.Sprintf("How long the most overdue pending entry has been idle beyond the reclaim idle time (0: none); a lower bound when more than %d are overdue.", overdueScan),
			nil, prometheus.Labels{"stream": cfg.Stream, "group": cfg.Group}),
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
	length, pending, err := c.g.Stats(ctx)
	if err != nil {
		c.log.Warn("read stream metrics failed", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.length, prometheus.GaugeValue, float64(length))
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(pending))
	overdue, err := c.g.Overdue(ctx, c.reclaimIdle, overdueScan)
	if err != nil {
		c.log.Warn("read overdue pending entries failed", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.overdue, prometheus.GaugeValue, overdue.Seconds())
}
