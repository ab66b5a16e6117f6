package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/promreg"
)

// Publish results, the {result} label of outbox_publish_total and (success
// and failure only) of outbox_publish_seconds (docs/ARCHITECTURE.md §6).
const (
	resultSuccess = "success"
	resultFailure = "failure"
	resultDead    = "dead"
)

// relayMetrics are the relay's metrics (docs/ARCHITECTURE.md §6).
type relayMetrics struct {
	publishTotal   *prometheus.CounterVec   // outbox_publish_total{result}: rows
	publishSeconds *prometheus.HistogramVec // outbox_publish_seconds{result}: one pipelined XADD round trip
	publishDelay   prometheus.Histogram     // outbox_publish_delay_seconds: due since (dueSinceSQL) → sent_at
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
			Help:    "Time from when an outbox row became due (its created_at; a delayed task's row: its due time) to its sent_at.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}),
	}
	var err error
	if m.publishTotal, err = promreg.Register(reg, m.publishTotal); err != nil {
		return nil, err
	}
	if m.publishSeconds, err = promreg.Register(reg, m.publishSeconds); err != nil {
		return nil, err
	}
	if m.publishDelay, err = promreg.Register(reg, m.publishDelay); err != nil {
		return nil, err
	}
	for _, r := range []string{resultSuccess, resultFailure, resultDead} {
		m.publishTotal.WithLabelValues(r)
	}
	if _, err := promreg.Register(reg, &backlogCollector{backlog: &backlogReader{db: pool, every: frontEvery}, logger: logger}); err != nil {
		return nil, err
	}
	return m, nil
}

var (
	backlogDesc = prometheus.NewDesc("outbox_backlog",
		"Outbox rows due and not yet published (NEW or RETRYING; a delayed task's row counts once its time has come).", nil, nil)
	backlogAgeDesc = prometheus.NewDesc("outbox_backlog_age_seconds",
		"How long the longest-waiting due outbox row has been due (0 when none is).", nil, nil)
	scheduledDesc = prometheus.NewDesc("outbox_scheduled",
		"Outbox rows of delayed tasks whose time has not come (published when it does).", nil, nil)
)

// backlogCollector reads the backlog gauges from Postgres at scrape time
// (backlogReader: the recent and scheduled unsent rows at each scrape,
// those long due once a minute).
type backlogCollector struct {
	backlog *backlogReader
	logger  *slog.Logger
}

func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- backlogAgeDesc
	ch <- scheduledDesc
}

func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := c.backlog.read(ctx)
	if err != nil {
		// A failed scrape of these gauges must not fail the whole
		// /metrics page: leave them out (the alert sees them absent).
		c.logger.Warn("outbox backlog metrics", "err", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(b.Due))
	ch <- prometheus.MustNewConstMetric(backlogAgeDesc, prometheus.GaugeValue, b.OldestDue.Seconds())
	ch <- prometheus.MustNewConstMetric(scheduledDesc, prometheus.GaugeValue, float64(b.Scheduled))
}
