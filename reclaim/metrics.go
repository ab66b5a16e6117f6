package reclaim

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of ingest_stream_reclaim_total (contract).
const (
	resultClaimed = "claimed" // entries claimed with XAUTOCLAIM
	resultDeleted = "deleted" // deleted entry ids XAUTOCLAIM reported
	resultError   = "error"   // failed operations
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
		Help: "Pending stream entries handled by the reclaimer, by result: claimed, deleted (trimmed or deleted entries XAUTOCLAIM reported), error (failed operations).",
	}, []string{"result"})
	if reg != nil {
		if err := reg.Register(total); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("register ingest_stream_reclaim_total: %w", err)
			}
			existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
			if !ok {
				return nil, fmt.Errorf("register ingest_stream_reclaim_total: %w", err)
			}
			total = existing
		}
	}
	for _, r := range []string{resultClaimed, resultDeleted, resultError} {
		total.WithLabelValues(r) // export zeros from the start
	}
	return &metrics{total: total}, nil
}

func (m *metrics) add(result string, n int) {
	if n > 0 {
		m.total.WithLabelValues(result).Add(float64(n))
	}
}
