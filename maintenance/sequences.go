package maintenance

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/task"
)

const componentSequences = "sequences"

// sequenceCounter counts the blocked sequences of each kind (sequence
// keys held by a DEAD task under the kind's sequence_on_failure block:
// task.Store.BlockedSequenceCounts) for ingest_sequences_blocked, on the
// releaser's counting interval. It changes nothing.
type sequenceCounter struct {
	interval time.Duration
	store    *task.Store
	metrics  *metrics

	mu     sync.Mutex // guards the snapshot, read at scrape time
	at     time.Time
	counts map[string]int64 // kind → blocked sequences
}

func newSequenceCounter(interval time.Duration, store *task.Store, m *metrics) *sequenceCounter {
	return &sequenceCounter{interval: interval, store: store, metrics: m}
}

func (c *sequenceCounter) service() *service {
	return &service{
		name:     componentSequences,
		interval: c.interval,
		pass: func(ctx context.Context) ([]any, error) {
			return nil, c.runOnce(ctx)
		},
		failed: func() { c.metrics.failures.WithLabelValues(componentSequences).Inc() },
	}
}

// runOnce takes a new count. A kind counted before and not now is
// reported as 0, so that its series drops to 0 rather than vanishing.
func (c *sequenceCounter) runOnce(ctx context.Context) error {
	counts, err := c.store.BlockedSequenceCounts(ctx, "")
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for kind := range c.counts {
		if _, ok := counts[kind]; !ok {
			counts[kind] = 0
		}
	}
	c.at, c.counts = time.Now(), counts
	return nil
}

// blockedCollector exports ingest_sequences_blocked from the last count
// while it is fresh: only the leader reports it, and a former leader
// stops once its count is older than three intervals.
type blockedCollector struct {
	c    *sequenceCounter
	desc *prometheus.Desc
}

func newBlockedCollector(c *sequenceCounter) *blockedCollector {
	return &blockedCollector{c: c, desc: prometheus.NewDesc("ingest_sequences_blocked",
		"Sequence keys of the kind held by a DEAD task (its later tasks wait until it is redriven and succeeds, or is deleted); reported by the leader only.",
		[]string{"kind"}, nil)}
}

func (b *blockedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b *blockedCollector) Collect(ch chan<- prometheus.Metric) {
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	if time.Since(b.c.at) >= 3*b.c.interval {
		return
	}
	for kind, n := range b.c.counts {
		ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, float64(n), kind)
	}
}
