package ingest

import (
	"container/heap"
	"sync"
	"time"
)

// The worker's own redelivery of the messages it defers, where they stay
// pending with it (Redis mode). A deferred entry (a retry, a task not yet
// due, one under another live lease, a throttled start) is made claimable
// at its time by its idle time (settle), and the reclaimer finds it at its
// next round: up to a reclaim interval (INGEST_REDIS_RECLAIM_INTERVAL_MS,
// 5 s) after that time. The worker also keeps the delivery and hands it
// to its own processor when the time comes, so a retry due in one second
// starts after one second, not one to six.
//
// This is only the early path; the reclaimer remains the one that never
// misses. It takes every entry this path does not: the process stopped or
// is stopping, more than maxRedeliveries were waiting, the time was
// beyond redeliverHorizon, or no message slot came free within
// redeliverHorizon of it (a worker whose slots are all taken tries again
// every redeliverRetry). A delivery by both is harmless: the in-flight set
// drops the second in one process, the start's guard across processes.

const (
	// redeliverHorizon is how far ahead a deferred message's time may be
	// for the worker to keep it: beyond, the reclaimer's few seconds are a
	// small part of the wait.
	redeliverHorizon = time.Minute
	// maxRedeliveries bounds the deferred messages a worker keeps (each a
	// delivery, a few hundred bytes).
	maxRedeliveries = 10_000
	// redeliverRetry is how soon a due delivery that found no free message
	// slot is tried again, and the least time a delivery is kept.
	redeliverRetry = 20 * time.Millisecond
)

// redeliverer keeps deferred deliveries until their time and passes the
// due ones, oldest first, to deliver. Once stopped it keeps nothing.
type redeliverer struct {
	mu      sync.Mutex
	q       dueHeap
	stopped bool
	wake    chan struct{}
	done    chan struct{}
}

func newRedeliverer() *redeliverer {
	return &redeliverer{wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// add keeps d until at, unless stopped, at is beyond redeliverHorizon from
// now or maxRedeliveries are kept already. A delivery is handed back no
// sooner than redeliverRetry after now: a retry without backoff, or a
// start that found its task not yet due because the database's clock runs
// behind this worker's, must not turn into a loop of starts.
func (r *redeliverer) add(d delivery, at, now time.Time) {
	if at.Sub(now) > redeliverHorizon {
		return
	}
	if soonest := now.Add(redeliverRetry); at.Before(soonest) {
		at = soonest
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || len(r.q) >= maxRedeliveries {
		return
	}
	heap.Push(&r.q, due{at: at, since: at, d: d})
	if !r.q[0].at.Before(at) {
		select { // an earlier time than the loop waits for
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// next returns the earliest time kept.
func (r *redeliverer) next() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.q) == 0 {
		return time.Time{}, false
	}
	return r.q[0].at, true
}

// take removes and returns the deliveries due at now.
func (r *redeliverer) take(now time.Time) []due {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ds []due
	for len(r.q) > 0 && !r.q[0].at.After(now) {
		ds = append(ds, heap.Pop(&r.q).(due))
	}
	return ds
}

// again keeps ds, which found no free message slot at now, for another
// try after redeliverRetry, unless they fell due longer than
// redeliverHorizon ago (the reclaimer has had them) or r stopped.
func (r *redeliverer) again(ds []due, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	for _, d := range ds {
		if now.Sub(d.since) < redeliverHorizon {
			d.at = now.Add(redeliverRetry)
			heap.Push(&r.q, d)
		}
	}
}

// run passes due deliveries to deliver, which returns how many it took
// (the first ones), until stop.
func (r *redeliverer) run(deliver func([]delivery) int) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		t.Stop()
		if at, ok := r.next(); ok {
			t.Reset(time.Until(at))
		}
		select {
		case <-r.done:
			return
		case <-r.wake:
		case <-t.C:
		}
		now := time.Now()
		if ds := r.take(now); len(ds) > 0 {
			taken := deliver(deliveries(ds))
			r.again(ds[taken:], now)
		}
	}
}

// stop ends run and drops what is kept: the reclaimer finds those entries.
func (r *redeliverer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.stopped = true
		r.q = nil
		close(r.done)
	}
}

// due is a kept delivery: when it is tried next (at) and when it fell due
// (since).
type due struct {
	at, since time.Time
	d         delivery
}

func deliveries(ds []due) []delivery {
	out := make([]delivery, len(ds))
	for i, d := range ds {
		out[i] = d.d
	}
	return out
}

// dueHeap orders kept deliveries by time (container/heap).
type dueHeap []due

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(due)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// redeliver hands due deliveries back to the processor, the first ones
// as many as free message slots allow, and returns how many.
func (p *processor) redeliver(ds []delivery) int {
	n := p.inflight.reserveDue(len(ds))
	if n == 0 {
		return 0
	}
	now := time.Now()
	for i := range ds[:n] {
		ds[i].received = now
	}
	p.process(p.ioCtx, ds[:n], n)
	return n
}
