package ingest

import (
	"context"
	"time"
)

// The message slots of inflight: the readers (the stream consumer, the
// Kafka fetcher) and the reclaimer reserve them before they read, and a
// message gives its slot back when it is settled (see inflight).

// reserve takes up to n free message slots for a reader and returns how
// many it took; the ahead ones only while aheadOn. It takes none while a
// reclaim round waits for a slot (reserveFirst).
func (f *inflight) reserve(n int) int { return f.reserveUnclaimed(n, true) }

// reserveDue is reserve for the deferred messages the worker redelivers
// itself (redeliver.go): it takes what is free without holding off to
// gather a bigger read, since they come as one batch already.
func (f *inflight) reserveDue(n int) int { return f.reserveUnclaimed(n, false) }

// reserveUnclaimed is reserveLocked under the lock, unless a reclaim round
// waits for a slot.
func (f *inflight) reserveUnclaimed(n int, gather bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.claimants > 0 {
		return 0
	}
	return f.reserveLocked(n, gather)
}

// reserveLocked takes up to n free message slots. gather: take none while
// enough started tasks wait for a handler slot, so that freed slots are
// read and started together.
func (f *inflight) reserveLocked(n int, gather bool) int {
	avail := f.free
	switch {
	case !f.aheadOn():
		avail -= f.ahead
	case gather && avail < f.ahead/4 && len(f.ready) >= f.ahead/4:
		// Enough started tasks wait to cover a start's round trip: gather
		// free slots for a bigger read and start, rather than one each.
		return 0
	}
	n = max(0, min(n, avail))
	f.free -= n
	return n
}

// claimPoll is how often a reclaim round waiting for a message slot
// checks for one besides the signal of a freed slot (the ahead slots come
// and go with the handlers' run time, without a signal).
const claimPoll = 100 * time.Millisecond

// reserveFirst takes up to n free message slots for a reclaim round,
// waiting up to wait for one ahead of the readers: while it waits,
// reserve grants none, so the next slot freed is its. It returns 0 when
// none came free in time or ctx is done.
//
// Without it a worker of one slot would almost never reclaim while its
// streams are idle: its consumer's blocking read holds that slot for up
// to Config.Block and takes it again the moment the read returns empty.
// With it the read's slot goes to the reclaimer when the read returns,
// and an entry the read returned keeps the slot it was read into, so
// nothing is read beyond the slots or handed back.
func (f *inflight) reserveFirst(ctx context.Context, n int, wait time.Duration) int {
	f.mu.Lock()
	if got := f.reserveLocked(n, false); got > 0 {
		f.mu.Unlock()
		return got
	}
	f.claimants++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.claimants--
		f.mu.Unlock()
		f.signalFreed() // the readers take slots again
	}()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	poll := time.NewTicker(claimPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return 0
		case <-deadline.C:
			return 0
		case <-f.claimFreed:
		case <-poll.C:
		}
		f.mu.Lock()
		got := f.reserveLocked(n, false)
		f.mu.Unlock()
		if got > 0 {
			return got
		}
	}
}

// aheadOn reports whether tasks are started ahead of the handler slots:
// while the handlers' average run time is under aheadHandlerTime.
func (f *inflight) aheadOn() bool {
	return f.ahead > 0 && f.handlerTime < aheadHandlerTime
}

// freeSlotsLocked gives back n message slots and signals freed (and a
// reclaim round waiting for one).
func (f *inflight) freeSlotsLocked(n int) {
	if n <= 0 {
		return
	}
	f.free += n
	f.signalFreed()
	if f.claimants > 0 {
		select {
		case f.claimFreed <- struct{}{}:
		default:
		}
	}
}

// signalFreed wakes a reader waiting for message slots.
func (f *inflight) signalFreed() {
	select {
	case f.freed <- struct{}{}:
	default:
	}
}
