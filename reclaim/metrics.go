package reclaim

import (
	"github.com/ingest-worker/ingest/internal/promreg"

	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of ingest_stream_reclaim_total (contract).
const (
	resultClaimed  = "claimed"  // entries claimed with XAUTOCLAIM
	resultDeleted  = "deleted"  // deleted entry ids XAUTOCLAIM reported
	resultTakeover = "takeover" // entries of expired leases claimed from silent consumers
	resultError    = "error"    // failed operations
)

type metrics struct {
	total *prometheus.CounterVec
}

// newMetrics creates the reclaimer's metrics and registers them on reg (none
// when reg is nil). A collector that another reclaimer already registered on
// reg is shared.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	total := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ingest_stream_reclaim_total",
		Help: "Pending stream entries handled by the reclaimer, by result: claimed, deleted (trimmed or deleted entries XAUTOCLAIM reported), takeover (entries of tasks whose lease expired, claimed from consumers silent for a lease), error (failed operations).",
	}, []string{"result"})
	total, err := promreg.Register(reg, total)
	if err != nil {
		return nil, fmt.Errorf("ingest_stream_reclaim_total: %w", err)
	}
	for _, r := range []string{resultClaimed, resultDeleted, resultTakeover, resultError} {
		total.WithLabelValues(r) // export zeros from the start
	}
	return &metrics{total: total}, nil
}

func (m *metrics) add(result string, n int) {
	if n > 0 {
		m.total.WithLabelValues(result).Add(float64(n))
	}
}

// ErrorCounter returns ingest_stream_reclaim_total{result="error"},
// registered on reg (nil: not registered) or shared with the reclaimer
// that registered it there: the idle-consumer cleanup (package
// maintenance) counts its failures on it, as it did when the reclaimer ran
// it.
func ErrorCounter(reg prometheus.Registerer) (prometheus.Counter, error) {
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("reclaim: %w", err)
	}
	return m.total.WithLabelValues(resultError), nil
}
