package ingest

import (
	"time"

	"github.com/google/uuid"
)

// What the heartbeater reads and marks in the in-flight set (inflight): the
// leases it renews, the entries it keeps fresh, and the runs it finds lost,
// cancelled or abandoned.

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

// live returns those of ids still in flight whose entries the heartbeat
// keeps (reusing ids' array): not those of runs marked lost since they
// were listed. An abandoned run's entry is handed to the abandoned
// consumer, and a run whose lease was lost has its entry with the worker
// that took it over: refreshing either would claim it back to this
// consumer, which reads and is heard from, so no other worker would take
// the task over until the reclaim idle time.
func (f *inflight) live(ids []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := ids[:0]
	for _, id := range ids {
		if _, ok := f.ids[id]; !ok {
			continue
		}
		if r := f.running[id]; r != nil && r.lost {
			continue
		}
		out = append(out, id)
	}
	return out
}

// renewed takes the outcome of a lease renewal of the tasks of ids, ok
// holding those renewed, made at at (zero: the renewal failed, ok holds
// them all): it returns the message ids of the renewed runs, and marks
// lost (calling lose, under the lock) each other run whose handler has
// not returned.
func (f *inflight) renewed(ids []uuid.UUID, ok map[uuid.UUID]bool, at time.Time, lose func(mid string, r *run)) []string {
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
			if !at.IsZero() {
				r.leased = at
			}
		case r.returned:
			// its outcome is being recorded; the guard settles it
		default:
			r.lost = true
			lose(mid, r)
			f.cutOffLocked(r)
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
	f.cutOffLocked(r)
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
