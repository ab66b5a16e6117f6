package ingest

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/stream"
)

// Values of the result label (DESIGN §6; released and poison are
// additions).
const (
	resultSucceeded = "succeeded"
	resultRetry     = "retry"
	resultDead      = "dead"
	resultSkipped   = "skipped"
	resultNotDue    = "not_due"
	resultConflict  = "conflict"
	resultReleased  = "released" // handed back at shutdown
	resultPoison    = "poison"   // no valid task_id: dead-lettered
)

var results = []string{resultSucceeded, resultRetry, resultDead, resultSkipped, resultNotDue, resultConflict, resultReleased, resultPoison}

// metrics are the worker's Prometheus metrics.
type metrics struct {
	total   *prometheus.CounterVec
	seconds *prometheus.HistogramVec
	dlq     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, g *stream.Group, log *slog.Logger) (*metrics, error) {
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
	}
	var err error
	if m.total, err = register(reg, m.total); err != nil {
		return nil, err
	}
	if m.seconds, err = register(reg, m.seconds); err != nil {
		return nil, err
	}
	if m.dlq, err = register(reg, m.dlq); err != nil {
		return nil, err
	}
	for _, r := range results {
		m.total.WithLabelValues(r)
	}
	// A second worker of the same stream in this process shares the first
	// one's collector.
	if _, err := register[prometheus.Collector](reg, newStreamCollector(g, log)); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the equal collector already registered.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, err
}

func (m *metrics) observe(result string, since time.Time) {
	if result == "" {
		return
	}
	m.total.WithLabelValues(result).Inc()
	m.seconds.WithLabelValues(result).Observe(time.Since(since).Seconds())
}

// streamCollector reads ingest_stream_length and ingest_stream_pending
// from Redis at scrape time.
type streamCollector struct {
	g       *stream.Group
	log     *slog.Logger
	length  *prometheus.Desc
	pending *prometheus.Desc
}

// collectTimeout bounds the Redis calls of one scrape.
const collectTimeout = 2 * time.Second

func newStreamCollector(g *stream.Group, log *slog.Logger) *streamCollector {
	cfg := g.Config()
	return &streamCollector{
		g:   g,
		log: log,
		length: prometheus.NewDesc("ingest_stream_length", "Entries in the task stream (XLEN).",
			nil, prometheus.Labels{"stream": cfg.Stream}),
		pending: prometheus.NewDesc("ingest_stream_pending", "Entries delivered and not yet acknowledged (XPENDING).",
			nil, prometheus.Labels{"stream": cfg.Stream, "group": cfg.Group}),
	}
}

func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.length
	ch <- c.pending
}

// Collect reports nothing when Redis does not answer: a failed scrape of
// these two gauges must not fail the others.
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
}
