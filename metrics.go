package ingest

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/promreg"
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
	// batchSize observes the tasks of each batch handler call, by kind.
	batchSize *prometheus.HistogramVec
}

// newMetrics registers the worker metrics (the queue's gauges are its
// mode's: see streamCollector).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
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
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ingest_task_batch_size",
			Help:    "Tasks handed to each call of a batch handler, by kind.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000},
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
	if m.batchSize, err = promreg.Register(reg, m.batchSize); err != nil {
		return nil, err
	}
	for _, r := range results {
		m.total.WithLabelValues(r)
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
