package task

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is the retry delay policy:
//
//	backoff(attempt) = min(Base * 2^(attempt-1), Max) * (1 ± Jitter)
//
// where attempt is the number of failures so far (1 after the first).
type Backoff struct {
	Base   time.Duration
	Max    time.Duration
	Jitter float64 // fraction in [0, 1): 0.1 spreads delays by ±10%
}

// Defaults of DESIGN §5.
const (
	DefaultBackoffBase   = time.Second
	DefaultBackoffMax    = 10 * time.Minute
	DefaultBackoffJitter = 0.1
)

// DefaultBackoff is the policy used when none is configured.
var DefaultBackoff = Backoff{Base: DefaultBackoffBase, Max: DefaultBackoffMax, Jitter: DefaultBackoffJitter}

// Validate checks the policy and names the bad field.
func (b Backoff) Validate() error {
	switch {
	case b.Base <= 0:
		return fmt.Errorf("backoff base must be > 0, got %s", b.Base)
	case b.Max < b.Base:
		return fmt.Errorf("backoff max (%s) must be >= base (%s)", b.Max, b.Base)
	case !(b.Jitter >= 0 && b.Jitter < 1): // also refuses NaN
		return fmt.Errorf("backoff jitter must be in [0, 1), got %v", b.Jitter)
	}
	return nil
}

// Bounds returns the least and the greatest delay after attempt failures.
func (b Backoff) Bounds(attempt int) (lo, hi time.Duration) {
	d := b.capped(attempt)
	return time.Duration(d * (1 - b.Jitter)), time.Duration(d * (1 + b.Jitter))
}

// Delay returns a jittered delay after attempt failures.
func (b Backoff) Delay(attempt int) time.Duration {
	return time.Duration(b.capped(attempt) * (1 + b.Jitter*(2*rand.Float64()-1)))
}

// capped is min(Base * 2^(attempt-1), Max) in nanoseconds.
func (b Backoff) capped(attempt int) float64 {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(b.Base) * math.Pow(2, float64(min(attempt-1, 62)))
	return math.Min(d, float64(b.Max))
}
