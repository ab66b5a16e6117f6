package maintenance

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/promreg"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// Components, the {component} label of outbox_maintenance_errors_total.
const (
	componentRescuer    = "rescuer"
	componentRetention  = "retention"
	componentPartitions = "partitions"
	componentLowWater   = "low_water"
)

// metrics are the maintainer's metrics. The rescuer's and retention's
// counters keep the names they had when package outbox ran them; the
// idle-consumer cleanup counts its failures on the reclaimer's error
// counter, as it did when the reclaimer ran it.
type metrics struct {
	rescued        prometheus.Counter     // outbox_rescued_total
	tasksDeleted   *prometheus.CounterVec // ingest_task_retention_deleted_total{status}
	trimmed        *prometheus.CounterVec // outbox_stream_trimmed_total{stream}
	failures       *prometheus.CounterVec // outbox_maintenance_errors_total{component}
	consumerErrors prometheus.Counter     // ingest_stream_reclaim_total{result="error"}
	leader         *prometheus.GaugeVec   // ingest_leader{name}
}

// newMetrics creates the metrics and registers them on reg (nil: none).
// The reclaimer's error counter is only taken when consumers (the
// idle-consumer cleanup) is set.
func newMetrics(reg prometheus.Registerer, consumers bool) (*metrics, error) {
	m := &metrics{
		rescued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_rescued_total",
			Help: "Tasks the rescuer found missing from Redis and gave a new outbox row.",
		}),
		tasksDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ingest_task_retention_deleted_total",
			Help: "Finished tasks deleted by retention (their audit and outbox rows go with their partitions) after their state's retention window, by state.",
		}, []string{"status"}),
		trimmed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_stream_trimmed_total",
			Help: "Entries trimmed from a task stream by retention (XTRIM MINID).",
		}, []string{"stream"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_maintenance_errors_total",
			Help: "Failed passes of the outbox rescuer, retention and the upkeep of the audit and outbox partitions and the low water's raise.",
		}, []string{"component"}),
		leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ingest_leader",
			Help: "1 while this process is the elected leader that runs the singleton maintenance services (rescuer, retention, idle-consumer cleanup), else 0.",
		}, []string{"name"}),
	}
	var err error
	if m.rescued, err = promreg.Register(reg, m.rescued); err != nil {
		return nil, err
	}
	if m.tasksDeleted, err = promreg.Register(reg, m.tasksDeleted); err != nil {
		return nil, err
	}
	for _, s := range []task.State{task.Succeeded, task.Cancelled, task.Dead} {
		m.tasksDeleted.WithLabelValues(string(s)) // export zeros from the start
	}
	if m.trimmed, err = promreg.Register(reg, m.trimmed); err != nil {
		return nil, err
	}
	if m.failures, err = promreg.Register(reg, m.failures); err != nil {
		return nil, err
	}
	for _, c := range []string{componentRescuer, componentRetention, componentPartitions, componentLowWater} {
		m.failures.WithLabelValues(c) // export zeros from the start
	}
	if m.leader, err = promreg.Register(reg, m.leader); err != nil {
		return nil, err
	}
	if consumers {
		if m.consumerErrors, err = reclaim.ErrorCounter(reg); err != nil {
			return nil, err
		}
	}
	return m, nil
}
