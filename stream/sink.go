package stream

import (
	"context"
	"time"

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

// SlotWaiter may be implemented by a Sink: ReserveFirst waits up to wait
// for a free slot ahead of the Sink's other readers (Reserve grants none
// meanwhile, so the next slot freed is its) and reserves up to n; it
// returns 0 when none came free in time or ctx is done. The reclaimer
// uses it for the first page of a round: the consumer's blocking read
// holds a slot while the streams are idle and takes it again as soon as
// the read returns, so a Sink of one slot would otherwise almost never
// have one free for a reclaim round.
type SlotWaiter interface {
	ReserveFirst(ctx context.Context, n int, wait time.Duration) int
}
