// Package memlimit gives the worker binary a soft memory limit by default,
// which keeps a worker with many handlers waiting at once (many goroutine
// stacks beside a small heap) small, and never makes the garbage collector
// run more often than Go's default pacing of the live heap alone would.
//
// Go's default pacing (GOGC=100) lets the heap grow, before the next
// collection, by the live heap plus the goroutine stacks and globals. A
// worker with 10,000 handlers waiting holds about 40 MiB of stacks beside
// 20 MiB of live heap: the heap may then grow by 60 MiB, and the process
// peaks near 150 MiB, most of it garbage. Start sets the runtime's soft
// memory limit (runtime/debug.SetMemoryLimit) to the larger of a floor
// and what the live heap needs under the default pacing without the stacks
// counted as growth room (the memory outside the heap, plus the live heap
// grown by GOGC percent), and recomputes it after every collection. Below
// the floor nothing changes; above it the limit follows the live heap, so
// a worker whose live heap is large collects as often as Go's default
// would have it, never in a loop against a fixed limit.
//
// An operator's GOMEMLIMIT (or GOGC=off) wins: Start then does nothing.
package memlimit

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// DefaultFloor is the limit below which the binary's workers never set
// theirs (docs/PERFORMANCE.md has what it does to the peak RSS of a
// worker with thousands of handlers waiting). The binary's code pages are
// on top of the limit.
const DefaultFloor = 88 << 20

var samples = []metrics.Sample{
	{Name: "/gc/heap/live:bytes"},
	{Name: "/gc/gogc:percent"},
	{Name: "/memory/classes/total:bytes"},
	{Name: "/memory/classes/heap/released:bytes"},
	{Name: "/memory/classes/heap/objects:bytes"},
	{Name: "/memory/classes/heap/unused:bytes"},
	{Name: "/memory/classes/heap/free:bytes"},
}

// Limit returns the limit for the given state of the runtime: the larger
// of floor and nonHeap + live × (1 + gogc/100).
func Limit(floor int64, live, nonHeap uint64, gogc int64) int64 {
	need := float64(nonHeap) + float64(live)*(1+float64(gogc)/100)
	if need >= math.MaxInt64 {
		return math.MaxInt64
	}
	return max(floor, int64(need))
}

// tuner recomputes the limit after every collection.
type tuner struct {
	floor   int64
	mu      sync.Mutex // held by tune and stop
	stopped bool
	s       []metrics.Sample
}

// Start sets the soft memory limit to floor and recomputes it after every
// collection (see the package comment) until stop is called. getenv reads
// the environment: with GOMEMLIMIT set, or GOGC=off, it does nothing and
// reports false.
func Start(getenv func(string) string, floor int64) (stop func(), started bool) {
	if getenv("GOMEMLIMIT") != "" || getenv("GOGC") == "off" {
		return func() {}, false
	}
	t := &tuner{floor: floor, s: append([]metrics.Sample(nil), samples...)}
	debug.SetMemoryLimit(floor)
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.stopped = true
		debug.SetMemoryLimit(math.MaxInt64)
	}, true
}

// sentinel is an object only a collection frees: its finalizer runs after
// each collection.
type sentinel struct{ t *tuner }

// arm makes the next collection call tune.
func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{t: t}, func(s *sentinel) {
		if s.t.tune() {
			s.t.arm()
		}
	})
}

// tune sets the limit from the state after the last collection, and
// reports false once stopped.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.s)
	v := func(i int) uint64 {
		if t.s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return t.s[i].Value.Uint64()
	}
	live := v(0)
	gogc := v(1)
	heap := v(3) + v(4) + v(5) + v(6)
	var nonHeap uint64
	if total := v(2); total > heap {
		nonHeap = total - heap
	}
	if gogc > 0 && live > 0 {
		debug.SetMemoryLimit(Limit(t.floor, live, nonHeap, int64(gogc)))
	}
	return true
}
