package ingest

import (
	"sync"

	"github.com/google/uuid"
)

// inflight is the processor's accounting of what it handles: its free
// handler slots, the messages in flight here, the runs of started tasks
// (by message and by task) and whether it is draining. One lock guards it
// all, and the flags of each run (returned, lost, cancelled). It does no
// I/O: the processor, the heartbeater and the completer ask it and act.
//
// A message takes a slot when it is admitted. A run gives its slot back
// once its handler has returned and handed its outcome to the completer
// (handedOver), but stays in flight, its lease renewed, until its outcome
// is recorded and its message settled; any other message gives its slot
// back when it is settled (or, for a DLQ write being retried, at the
// first failure). So the slots bound the handlers running and the
// messages being started, and the completer's queue bounds the outcomes
// waiting to be recorded.
type inflight struct {
	mu       sync.Mutex
	free     int  // free handler slots
	draining bool // shutting down: start nothing new
	// ids holds the message ids being handled here, each mapped to whether
	// it still holds a slot.
	ids     map[string]bool
	running map[string]*run      // by message id
	byTask  map[uuid.UUID]string // task id → message id of its run
	freed   chan struct{}        // signalled when slots are freed
}

func newInflight(slots int) *inflight {
	return &inflight{free: slots, ids: map[string]bool{}, running: map[string]*run{},
		byTask: map[uuid.UUID]string{}, freed: make(chan struct{}, 1)}
}

// freeCount returns the number of free slots.
func (f *inflight) freeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.free
}

// reserve takes up to n free slots and returns how many it took.
func (f *inflight) reserve(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n = max(0, min(n, f.free))
	f.free -= n
	return n
}

// freeSlotsLocked gives back n slots and signals freed.
func (f *inflight) freeSlotsLocked(n int) {
	if n <= 0 {
		return
	}
	f.free += n
	select {
	case f.freed <- struct{}{}:
	default:
	}
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

// handedOver gives back the slot of r, whose handler returned and whose
// outcome the completer has taken: r stays in flight until its message is
// settled. Its slot was given back already if r was settled meanwhile.
func (f *inflight) handedOver(r *run) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running[r.d.id] == r {
		f.freeSlotsLocked(f.releaseLocked([]delivery{r.d}))
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

// drain makes admit start nothing from now on.
func (f *inflight) drain() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.draining = true
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

// leased returns the task ids of the runs whose leases are renewed (not
// lost or abandoned).
func (f *inflight) leased() []uuid.UUID {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]uuid.UUID, 0, len(f.running))
	for _, r := range f.running {
		if !r.lost {
			ids = append(ids, r.task.ID)
		}
	}
	return ids
}

// held returns the ids of messages kept for a DLQ retry or a pending
// completion, which the heartbeat keeps fresh without a lease.
func (f *inflight) held() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.ids {
		if _, ok := f.running[id]; !ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// live returns those of ids still in flight (reusing ids' array).
func (f *inflight) live(ids []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := ids[:0]
	for _, id := range ids {
		if _, ok := f.ids[id]; ok {
			out = append(out, id)
		}
	}
	return out
}

// renewed takes the outcome of a lease renewal of the tasks of ids, ok
// holding those renewed: it returns the message ids of the renewed runs,
// and marks lost (calling lose, under the lock) each other run whose
// handler has not returned.
func (f *inflight) renewed(ids []uuid.UUID, ok map[uuid.UUID]bool, lose func(mid string, r *run)) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var fresh []string
	for _, id := range ids {
		mid, found := f.byTask[id]
		r := f.running[mid]
		switch {
		case !found || r == nil:
			// settled meanwhile
		case ok[id]:
			fresh = append(fresh, mid)
		case r.returned:
			// its outcome is being recorded; the guard settles it
		default:
			r.lost = true
			lose(mid, r)
		}
	}
	return fresh
}

// cancelled marks the run of task id cancelled, calling cancel under the
// lock, if it runs here, has not returned and was not cancelled before.
func (f *inflight) cancelled(id uuid.UUID, cancel func(mid string, r *run)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	mid, ok := f.byTask[id]
	r := f.running[mid]
	if !ok || r == nil || r.returned || r.cancelled {
		return
	}
	r.cancelled = true
	cancel(mid, r)
}

// abandoned marks r lost, its lease no longer renewed, and reports true,
// unless its handler returned or its lease was lost already.
func (f *inflight) abandoned(r *run) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.returned || r.lost {
		return false
	}
	r.lost = true
	return true
}
