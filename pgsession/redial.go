package pgsession

import (
	"context"
	"math/rand/v2"
	"time"
)

// Redial paces the attempts to re-open a lost LISTEN session: a pause of
// between half and all of a delay that doubles from Min up to Max, and
// starts from Min again once a session was established (Connected).
type Redial struct {
	Min, Max time.Duration
	delay    time.Duration
}

// Connected starts the pauses over from Min.
func (r *Redial) Connected() { r.delay = 0 }

// Pause returns the pause before the next attempt and doubles the delay.
func (r *Redial) Pause() time.Duration {
	if r.delay == 0 {
		r.delay = r.Min
	}
	d := time.Duration(float64(r.delay) * (0.5 + rand.Float64()/2))
	r.delay = min(2*r.delay, r.Max)
	return d
}

// Sleep waits d, or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
