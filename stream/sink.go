package stream

import (
	"time"

	"context"

	"github.com/redis/go-redis/v9"
)

// Sink is the processing path that delivered stream entries go to. The
// consumer (fresh entries, XREADGROUP) and the reclaimer (idle entries,
// XAUTOCLAIM) both feed one Sink, so a claimed entry is handled exactly like
// a fresh delivery.
//
// The protocol keeps reads within capacity: a reader first reserves handler
// slots, then reads at most that many entries, then hands them over.
type Sink interface {
	// Reserve reserves up to n free handler slots without blocking and
	// returns how many it reserved (0..n).
	Reserve(n int) int
	// Process handles entries read from the stream. It takes over
	// `reserved` slots (reserved >= len(msgs)): one per entry, released
	// when that entry's handling ends, and gives back the rest at once.
	// It does not block on handlers; errors are handled (and logged) inside.
	Process(ctx context.Context, msgs []redis.XMessage, reserved int)
}

// Binding is the place in the queue a sink serves: entries of Stream that
// Consumer of Group reads, left pending with idle times relative to
// ClaimIdle, the idle time after which a reclaimer claims a pending entry.
// Lease is the lease of the tasks the sink starts: a run's entry is kept
// fresh (idle well below Lease) while its lease is renewed, so an entry
// idle for a Lease whose task's lease expired has lost its worker.
type Binding struct {
	Stream    string
	Group     string
	Consumer  string
	ClaimIdle time.Duration
	Lease     time.Duration
}

// BoundSink is a Sink that serves one Binding (a worker's processing path
// is one). A reclaimer feeding it takes its stream, group, consumer and
// min-idle time from the binding, so the two cannot disagree.
type BoundSink interface {
	Sink
	Binding() Binding
}
