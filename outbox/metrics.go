package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Publish results, the {result} label of outbox_publish_total and
// outbox_publish_seconds (DESIGN §6).
const (
	resultSuccess = "success"
	resultFailure = "failure"
	resultDead    = "dead"
)

// relayMetrics are the relay's metrics (DESIGN §6).
type relayMetrics struct {
	publishTotal   *prometheus.CounterVec   // outbox_publish_total{result}: rows
	publishSeconds *prometheus.HistogramVec // outbox_publish_seconds{result}: one pipelined XADD round trip
	publishDelay   prometheus.Histogram     // outbox_publish_delay_seconds: created_at → sent_at
}

func newRelayMetrics(reg prometheus.Registerer, pool *pgxpool.Pool, logger *slog.Logger) (*relayMetrics, error) {
	m := &relayMetrics{
		publishTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_publish_total",
			Help: "Outbox rows by publish outcome: success (SENT), failure (RETRYING), dead (DEAD after the last attempt).",
		}, []string{"result"}),
		publishSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "outbox_publish_seconds",
			Help:    "Duration of one relay batch's pipelined XADD round trip, by result.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}, []string{"result"}),
		publishDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_publish_delay_seconds",
			Help:    "Time from an outbox row's created_at to its sent_at.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}),
	}
	var err error
	if m.publishTotal, err = register(reg, m.publishTotal); err != nil {
		return nil, err
	}
	if m.publishSeconds, err = register(reg, m.publishSeconds); err != nil {
		return nil, err
	}
	if m.publishDelay, err = register(reg, m.publishDelay); err != nil {
		return nil, err
	}
	for _, r := range []string{resultSuccess, resultFailure, resultDead} {
		m.publishTotal.WithLabelValues(r)
	}
	if _, err := register(reg, &backlogCollector{pool: pool, logger: logger}); err != nil {
		return nil, err
	}
	return m, nil
}

var (
	backlogDesc = prometheus.NewDesc("outbox_backlog",
		"Outbox rows not yet published (status NEW or RETRYING).", nil, nil)
	backlogAgeDesc = prometheus.NewDesc("outbox_backlog_age_seconds",
		"Age of the oldest unpublished outbox row (0 when there is none).", nil, nil)
)

// backlogSQL counts unsent rows on the partial claim index.
const backlogSQL = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM outbox_event WHERE status IN ('NEW', 'RETRYING')`

// backlogCollector reads the backlog gauges from Postgres at scrape time.
type backlogCollector struct {
	pool   *pgxpool.Pool
	logger *slog.Logger
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- backlogAgeDesc
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int64
	var age float64
	if err := c.pool.QueryRow(ctx, backlogSQL).Scan(&n, &age); err != nil {
		// A failed scrape of these two gauges must not fail the whole
		// /metrics page: leave them out (the alert sees them absent).
		c.logger.Warn("outbox backlog metrics", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(backlogAgeDesc, prometheus.GaugeValue, age)
}

// maintenanceMetrics are the rescuer's and retention's counters.
type maintenanceMetrics struct {
	rescued  prometheus.Counter     // outbox_rescued_total
	deleted  prometheus.Counter     // outbox_retention_deleted_total
	trimmed  *prometheus.CounterVec // outbox_stream_trimmed_total{stream}
	failures *prometheus.CounterVec // outbox_maintenance_errors_total{component}
}

func newMaintenanceMetrics(reg prometheus.Registerer) (*maintenanceMetrics, error) {
	m := &maintenanceMetrics{
		rescued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_rescued_total",
			Help: "Tasks the rescuer found missing from Redis and gave a new outbox row.",
		}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_retention_deleted_total",
			Help: "SENT outbox rows deleted by retention.",
		}),
		trimmed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_stream_trimmed_total",
			Help: "Entries trimmed from a task stream by retention (XTRIM MINID).",
		}, []string{"stream"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_maintenance_errors_total",
			Help: "Failed passes of the outbox rescuer and retention.",
		}, []string{"component"}),
	}
	var err error
	if m.rescued, err = register(reg, m.rescued); err != nil {
		return nil, err
	}
	if m.deleted, err = register(reg, m.deleted); err != nil {
		return nil, err
	}
	if m.trimmed, err = register(reg, m.trimmed); err != nil {
		return nil, err
	}
	if m.failures, err = register(reg, m.failures); err != nil {
		return nil, err
	}
	return m, nil
}
