package bench

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// histogram records durations in microseconds in log-linear buckets (32
// per power of two: at most ~3% error), lock-free and in constant memory,
// so a run of any length keeps a flat footprint.
type histogram struct {
	counts [64 + 40*32]atomic.Int64
	n      atomic.Int64
}

func bucketOf(us uint64) int {
	if us < 64 {
		return int(us)
	}
	e := bits.Len64(us) - 6 // >= 1
	m := us >> e            // 32..63
	i := 64 + (e-1)*32 + int(m-32)
	if i >= 64+40*32 {
		i = 64 + 40*32 - 1
	}
	return i
}

// bucketValue is the middle of bucket i, in microseconds.
func bucketValue(i int) float64 {
	if i < 64 {
		return float64(i)
	}
	e := (i-64)/32 + 1
	m := uint64((i-64)%32 + 32)
	lo := m << e
	hi := (m + 1) << e
	return float64(lo+hi) / 2
}

func (h *histogram) record(d time.Duration) {
	us := max(d.Microseconds(), 0)
	h.counts[bucketOf(uint64(us))].Add(1)
	h.n.Add(1)
}

// Percentiles are latencies in milliseconds.
type Percentiles struct {
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
	Count int64   `json:"count"`
}

func (h *histogram) percentiles() Percentiles {
	var counts [len(h.counts)]int64
	var total int64
	for i := range h.counts {
		counts[i] = h.counts[i].Load()
		total += counts[i]
	}
	p := Percentiles{Count: total}
	if total == 0 {
		return p
	}
	at := func(q float64) float64 {
		rank := int64(q*float64(total)+0.5) - 1
		rank = max(0, min(rank, total-1))
		var seen int64
		for i, c := range counts {
			seen += c
			if seen > rank {
				return bucketValue(i) / 1000
			}
		}
		return 0
	}
	p.P50, p.P95, p.P99, p.Max = at(0.50), at(0.95), at(0.99), at(1)
	return p
}

// add adds o's counts to h.
func (h *histogram) add(o *histogram) {
	for i := range o.counts {
		if c := o.counts[i].Load(); c != 0 {
			h.counts[i].Add(c)
		}
	}
	h.n.Add(o.n.Load())
}
