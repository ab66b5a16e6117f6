package maintenance

import (
	"context"
	"math/rand/v2"
	"time"
)

// loop is the run loop of every singleton service: it calls runOnce after
// a random start delay in [0, jitter × interval), then every interval,
// until ctx is done. Calls never overlap: a call that takes longer than
// interval delays the next one (the ticker drops the ticks it missed).
// The start delay spreads the first passes of the services that start
// together when a process becomes leader.
//
// A value on kick (nil: none) makes it call onKick at once, between
// calls of runOnce (never during one), also during the start delay.
func loop(ctx context.Context, interval time.Duration, jitter float64, runOnce func(context.Context),
	kick <-chan struct{}, onKick func(context.Context)) {
	runLoop(ctx, interval, startDelay(interval, jitter, rand.Float64), runOnce, kick, onKick)
}

// runLoop is loop with the start delay given.
func runLoop(ctx context.Context, interval, delay time.Duration, runOnce func(context.Context),
	kick <-chan struct{}, onKick func(context.Context)) {
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		if !wait(ctx, t.C, kick, onKick) {
			return
		}
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for ctx.Err() == nil {
		runOnce(ctx)
		if !wait(ctx, ticker.C, kick, onKick) {
			return
		}
	}
}

// wait waits for tick, running onKick for every kick meanwhile; it
// returns false when ctx ended first.
func wait(ctx context.Context, tick <-chan time.Time, kick <-chan struct{}, onKick func(context.Context)) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			return true
		case <-kick:
			onKick(ctx)
		}
	}
}

// startDelay returns a delay in [0, jitter × interval), uniform through
// rnd (a source of floats in [0, 1)). jitter is clamped to [0, 1].
func startDelay(interval time.Duration, jitter float64, rnd func() float64) time.Duration {
	jitter = min(max(jitter, 0), 1)
	return time.Duration(rnd() * jitter * float64(interval))
}
