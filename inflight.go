package ingest

import (
	"sync"
	"time"

	"github.com/google/uuid"
)

// inflight is the processor's accounting of what it handles: its message
// slots and handler slots, the messages in flight here, the runs of
// started tasks (by message and by task), the runs and messages waiting
// for a handler slot, and whether it is draining. One lock guards it all,
// and the flags of each run (returned, lost, cancelled, slot). It does no
// I/O: the processor, the heartbeater and the completer ask it and act.
//
// A message takes a message slot when it is admitted. There are
// Concurrency of them, plus ahead more while handlers return quickly
// (aheadOn): the tasks of those are started before a handler slot is free,
// so that a returning handler's slot passes straight to a started task
// rather than waiting for a start's round trip (docs/ARCHITECTURE.md
// §1.3). A run takes a handler slot (Concurrency of them) to call its
// handler, or waits for one in ready, oldest first; a message of a
// limited kind takes one before its task is started, or waits for one
// unstarted (so a limited kind never holds a start it is not running).
// A run gives both slots back once its handler has returned and handed
// its outcome to the completer (handedOver), but stays in flight, its
// lease renewed, until its outcome is recorded and its message settled;
// any other message gives its message slot back when it is settled (or,
// for a DLQ write being retried, at the first failure). So the handler
// slots bound the handlers running, the message slots the messages being
// started or waiting, and the completer's queue the outcomes waiting to
// be recorded.
type inflight struct {
	mu       sync.Mutex
	free     int  // free message slots
	draining bool // shutting down: start nothing new
	// ahead is how many of the message slots are for tasks started ahead
	// of the handler slots; handlerTime is a moving average of the
	// handlers' run times, which decides whether they are granted
	// (aheadOn).
	ahead       int
	handlerTime time.Duration
	// handlers is the number of free handler slots; ready holds what waits
	// for one, oldest first (never both: a freed handler slot goes to the
	// oldest waiter). A started task whose lease was last known renewed
	// longer than maxWait ago when its handler is about to be called has
	// its lease confirmed first (stale; processor.confirmLease).
	handlers int
	ready    []waiter
	maxWait  time.Duration
	// exec runs a run's goroutine; startHeld starts the tasks of messages
	// that waited for a handler slot, each holding one (both set by the
	// processor).
	exec      func(*run)
	startHeld func([]delivery)
	// heldReady holds the messages of limited kinds that took a handler slot
	// after waiting for one and wait for their start; heldStarting is
	// true while a goroutine starts them (startHeldLoop): the slots freed
	// while a start is under way share the next one, a start (and, for a
	// kind limited per group, a turn of the group's start lock) for many
	// tasks instead of one each.
	heldReady    []delivery
	heldStarting bool
	// ids holds the message ids being handled here, each mapped to whether
	// it still holds a message slot.
	ids     map[string]bool
	running map[string]*run      // by message id
	byTask  map[uuid.UUID]string // task id → message id of its run
	freed   chan struct{}        // signalled when message slots are freed
	// claimants counts the reclaim rounds waiting for a message slot
	// ahead of the readers; claimFreed wakes one when slots are freed
	// (reserveFirst, slots.go).
	claimants  int
	claimFreed chan struct{}
}

// waiter waits in inflight.ready for a handler slot: a started run, or
// (r nil) the message of a limited kind, not yet started.
type waiter struct {
	r *run
	d delivery
}

// aheadHandlerTime is the average handler run time under which tasks are
// started ahead of the handler slots: above it a start's round trip is a
// small part of a slot's time, and a task started ahead would wait long.
const aheadHandlerTime = 50 * time.Millisecond

// aheadSlots is how many tasks are started ahead of slots handler slots.
func aheadSlots(slots int) int { return min(2*slots, 256) }

// newInflight returns the accounting of slots handler slots, with ahead
// message slots beside them; maxWait is how long ago a task's lease may
// have been last known renewed for its handler to be called without
// confirming it.
func newInflight(slots, ahead int, maxWait time.Duration) *inflight {
	// Nothing is started ahead until a handler has returned quickly: a
	// worker of long handlers never holds tasks waiting.
	return &inflight{free: slots + ahead, ahead: ahead, handlerTime: aheadHandlerTime, handlers: slots, maxWait: maxWait,
		ids: map[string]bool{}, running: map[string]*run{},
		byTask: map[uuid.UUID]string{}, freed: make(chan struct{}, 1), claimFreed: make(chan struct{}, 1)}
}

// freeCount returns the number of free handler slots.
func (f *inflight) freeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handlers
}

// toRun gives r, a started run, a handler slot: it reports true when r
// took one (the caller runs it), false when r waits in ready. While
// draining r is released at once (see cutOffLocked).
func (f *inflight) toRun(r *run) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.draining:
		r.cancel(errShutdown)
		f.cutOffLocked(r)
		return false
	case f.handlers > 0:
		f.handlers--
		r.slot = true
		return true
	}
	f.ready = append(f.ready, waiter{r: r})
	return false
}

// holdFor gives d, the message of a limited kind, a handler slot for its
// start: it reports held when d took a free one, queued when d waits in
// ready until one is free (then startHeld starts it), neither while
// draining.
func (f *inflight) holdFor(d delivery) (held, queued bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.draining:
		return false, false
	case f.handlers > 0:
		f.handlers--
		return true, false
	}
	f.ready = append(f.ready, waiter{d: d})
	return false, true
}

// handlerDone gives back a handler slot: the oldest waiter takes it.
func (f *inflight) handlerDone() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlerDoneLocked()
}

func (f *inflight) handlerDoneLocked() {
	if len(f.ready) == 0 {
		f.handlers++
		return
	}
	w := f.ready[0]
	f.ready[0] = waiter{}
	f.ready = f.ready[1:]
	if w.r == nil {
		f.heldReady = append(f.heldReady, w.d)
		if !f.heldStarting {
			f.heldStarting = true
			go f.startHeldLoop()
		}
		return
	}
	w.r.slot = true
	go f.exec(w.r)
	f.signalFreed() // fewer wait: reserve may grant slots again
}

// startHeldLoop starts the messages in heldReady, all those there at once,
// until none is left.
func (f *inflight) startHeldLoop() {
	for {
		f.mu.Lock()
		ds := f.heldReady
		f.heldReady = nil
		if len(ds) == 0 {
			f.heldStarting = false
			f.mu.Unlock()
			return
		}
		f.mu.Unlock()
		f.startHeld(ds)
	}
}

// stale reports whether r's lease was last known renewed longer than
// maxWait ago: its handler is not called before the lease is confirmed.
func (f *inflight) stale(r *run) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Since(r.leased) > f.maxWait
}

// leaseConfirmed takes the outcome of the confirmation of r's lease, made
// at at: renewed (r.leased moves on), or lost (r is marked lost, its lease
// no longer renewed; the caller cancels it).
func (f *inflight) leaseConfirmed(r *run, renewed bool, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if renewed {
		r.leased = at
	} else {
		r.lost = true
	}
}

// cutOffLocked runs r, whose context was just cancelled, at once without
// a handler slot if it waits for one (in ready, or just taken from it):
// its handler is not called (begin), and its outcome follows the cause.
// It does nothing to a run already running.
func (f *inflight) cutOffLocked(r *run) {
	if r.slot || r.returned {
		return
	}
	for i, w := range f.ready {
		if w.r == r {
			f.ready = append(f.ready[:i], f.ready[i+1:]...)
			f.signalFreed()
			break
		}
	}
	go f.exec(r)
}

// freeSlots gives back the slots that ds still hold, keeping them in
// flight (a DLQ write being retried).
func (f *inflight) freeSlots(ds ...delivery) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.freeSlotsLocked(f.releaseLocked(ds))
}

// releaseLocked marks the slots held by those of ds in flight as given
// back and returns how many there were.
func (f *inflight) releaseLocked(ds []delivery) int {
	n := 0
	for _, d := range ds {
		if f.ids[d.id] {
			f.ids[d.id] = false
			n++
		}
	}
	return n
}

// handedOver gives back the slots of r, whose handler returned and whose
// outcome the completer has taken: r stays in flight until its message is
// settled. Its message slot was given back already if r was settled
// meanwhile; it holds no handler slot if it was cut off while waiting for
// one. took is how long its handler ran (0: it was not called).
func (f *inflight) handedOver(r *run, took time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running[r.d.id] == r {
		f.freeSlotsLocked(f.releaseLocked([]delivery{r.d}))
	}
	if took > 0 {
		f.handlerTime += (took - f.handlerTime) / 8
	}
	if r.slot {
		r.slot = false
		f.handlerDoneLocked()
	}
}

// admit takes msgs, delivered with reserved slots: it returns the messages
// to start (now in flight, each holding a slot) and, while draining, the
// ids of those to hand back. A message already in flight here (delivered
// again: reclaimed, own-PEL re-read, redelivered after a rebalance) is
// dropped, as is its slot: this handling settles it. starting runs under
// the lock when there is something to start.
func (f *inflight) admit(msgs []delivery, reserved int, starting func()) (start []delivery, handBack []string, again []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if over := len(msgs) - reserved; over > 0 {
		f.free -= over // a caller broke the protocol; keep the count exact
	}
	f.freeSlotsLocked(reserved - len(msgs))
	start = make([]delivery, 0, len(msgs))
	for _, m := range msgs {
		_, busy := f.ids[m.id]
		switch {
		case busy:
			f.freeSlotsLocked(1)
			again = append(again, m.id)
		case f.draining:
			f.freeSlotsLocked(1)
			handBack = append(handBack, m.id)
		default:
			f.ids[m.id] = true
			start = append(start, m)
		}
	}
	if len(start) > 0 {
		starting()
	}
	return start, handBack, again
}

// drain makes admit start nothing from now on: the runs waiting for a
// handler slot are released (cause errShutdown), and the messages waiting
// unstarted are returned, for the caller to hand back.
func (f *inflight) drain() []delivery {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.draining = true
	var back []delivery
	ready := f.ready
	f.ready = nil
	for _, w := range ready {
		if w.r == nil {
			back = append(back, w.d)
			continue
		}
		w.r.cancel(errShutdown)
		f.cutOffLocked(w.r)
	}
	return back
}

// runningCount returns the number of runs whose handlers have not
// returned.
func (f *inflight) runningCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.running {
		if !r.returned {
			n++
		}
	}
	return n
}

// add records r, the run of a started task.
func (f *inflight) add(r *run) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running[r.d.id] = r
	f.byTask[r.task.ID] = r.d.id
}

// settled ends the handling of ds: they leave the in-flight set and give
// back the slots they still hold.
func (f *inflight) settled(ds ...delivery) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.freeSlotsLocked(f.forgetLocked(ds))
}

// forget removes ds from the in-flight set and returns how many slots they
// held, which the caller gives back (freeSlotCount).
func (f *inflight) forget(ds ...delivery) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.forgetLocked(ds)
}

// freeSlotCount gives back n slots, those of messages forgotten before.
func (f *inflight) freeSlotCount(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.freeSlotsLocked(n)
}

func (f *inflight) forgetLocked(ds []delivery) int {
	n := f.releaseLocked(ds)
	for _, d := range ds {
		if r, ok := f.running[d.id]; ok {
			delete(f.running, d.id)
			if f.byTask[r.task.ID] == d.id {
				delete(f.byTask, r.task.ID)
			}
		}
		delete(f.ids, d.id)
	}
	return n
}

// runs reports whether task id has a run here.
func (f *inflight) runs(id uuid.UUID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.byTask[id]
	return ok
}

// returned marks r's handler returned.
func (f *inflight) returned(r *run) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r.returned = true
}

// hasReturned reports whether r's handler returned.
func (f *inflight) hasReturned(r *run) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return r.returned
}
