package bench

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// tracker joins the three moments of each task: the commit of its
// creating transaction, the start of its handler and the commit that made
// it SUCCEEDED. The moments may be learnt in any order (a fast worker can
// start a task before its producer has noted the commit); each latency is
// recorded once both of its ends are known, and a task is forgotten once
// it is done, so memory follows the tasks in flight, not the run's length.
type tracker struct {
	shards [64]trackerShard
	start  histogram // commit → handler start
	done   histogram // commit → SUCCEEDED committed
	// window is commit → handler start of the current sample (see
	// Options.Sample), taken and replaced by takeWindow.
	window atomic.Pointer[histogram]
}

// takeWindow returns the commit → handler start latencies recorded since
// the previous call (or since the start) and starts a new window.
func (t *tracker) takeWindow() *histogram {
	return t.window.Swap(new(histogram))
}

type trackerShard struct {
	mu sync.Mutex
	m  map[uuid.UUID]moments
}

// moments are Unix nanoseconds; 0 means not known yet.
type moments struct {
	commit, start, done int64
	startRecorded       bool
}

func newTracker() *tracker {
	t := &tracker{}
	for i := range t.shards {
		t.shards[i].m = map[uuid.UUID]moments{}
	}
	t.window.Store(new(histogram))
	return t
}

func (t *tracker) shard(id uuid.UUID) *trackerShard {
	return &t.shards[int(id[15])%len(t.shards)]
}

// update applies f to id's moments and records what became known.
func (t *tracker) update(id uuid.UUID, f func(*moments)) {
	s := t.shard(id)
	s.mu.Lock()
	m := s.m[id]
	f(&m)
	if m.commit != 0 && m.start != 0 && !m.startRecorded {
		t.start.record(time.Duration(m.start - m.commit))
		t.window.Load().record(time.Duration(m.start - m.commit))
		m.startRecorded = true
	}
	if m.commit != 0 && m.done != 0 {
		t.done.record(time.Duration(m.done - m.commit))
		delete(s.m, id)
	} else {
		s.m[id] = m
	}
	s.mu.Unlock()
}

func (t *tracker) committed(ids []uuid.UUID, at time.Time) {
	ns := at.UnixNano()
	for _, id := range ids {
		t.update(id, func(m *moments) { m.commit = ns })
	}
}

func (t *tracker) started(id uuid.UUID, at time.Time) {
	ns := at.UnixNano()
	t.update(id, func(m *moments) {
		if m.start == 0 {
			m.start = ns
		}
	})
}

func (t *tracker) succeeded(ids []uuid.UUID, at time.Time) {
	ns := at.UnixNano()
	for _, id := range ids {
		t.update(id, func(m *moments) { m.done = ns })
	}
}
