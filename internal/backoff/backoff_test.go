package backoff_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/backoff"
)

func TestBounds(t *testing.T) {
	t.Parallel()
	pct := func(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }
	tests := []struct {
		name    string
		p       backoff.Policy
		attempt int
		center  time.Duration // min(base*2^(attempt-1), max)
	}{
		{"FirstFailure", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 1, time.Second},
		{"ZeroCountsAsFirst", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 0, time.Second},
		{"NegativeCountsAsFirst", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, -3, time.Second},
		{"Second", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 2, 2 * time.Second},
		{"Third", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 3, 4 * time.Second},
		{"LastBelowCap", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 6, 32 * time.Second},
		{"Capped", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 7, time.Minute},
		{"CapExactlyReached", backoff.Policy{Base: time.Second, Max: 4 * time.Second, Jitter: 0.25}, 3, 4 * time.Second},
		{"HugeAttemptStaysCapped", backoff.Policy{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 1000, time.Minute},
		{"MaxIntAttempt", backoff.Policy{Base: time.Second, Max: time.Hour, Jitter: 0.1}, math.MaxInt, time.Hour},
		{"MaxEqualsBase", backoff.Policy{Base: 5 * time.Millisecond, Max: 5 * time.Millisecond, Jitter: 0.5}, 9, 5 * time.Millisecond},
		{"NoJitter", backoff.Policy{Base: 100 * time.Millisecond, Max: time.Second, Jitter: 0}, 3, 400 * time.Millisecond},
		{"SubMillisecond", backoff.Policy{Base: 1500 * time.Microsecond, Max: time.Second, Jitter: 0}, 2, 3 * time.Millisecond},
		{"ZeroIsAtOnce", backoff.Policy{Jitter: 0.1}, 5, 0},
		{"ZeroBaseCappedMax", backoff.Policy{Max: time.Minute, Jitter: 0.1}, math.MaxInt, 0},
		{"OneNanosecondBaseReachesLargestMax", backoff.Policy{Base: 1, Max: math.MaxInt64}, math.MaxInt, math.MaxInt64},
		{"Defaults", backoff.Default, 11, 10 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lo, hi := tt.p.Bounds(tt.attempt)
			wantLo, wantHi := pct(tt.center, 1-tt.p.Jitter), pct(tt.center, 1+tt.p.Jitter)
			if tt.center == math.MaxInt64 {
				wantLo, wantHi = math.MaxInt64, math.MaxInt64 // saturated, not overflowed
			}
			if lo != wantLo || hi != wantHi {
				t.Fatalf("Bounds(%d) = [%s, %s], want [%s, %s]", tt.attempt, lo, hi, wantLo, wantHi)
			}
			if lo > hi || (tt.center != math.MaxInt64 && hi > pct(tt.p.Max, 1+tt.p.Jitter)) {
				t.Fatalf("Bounds(%d) = [%s, %s] exceed the cap %s*(1+%v)", tt.attempt, lo, hi, tt.p.Max, tt.p.Jitter)
			}
			// The draw's end points: u = 0 is the least delay, u = 0.5 the
			// unjittered one, and u just below 1 stays at most the greatest.
			if d := tt.p.Delay(tt.attempt, 0); d != lo {
				t.Fatalf("Delay(%d, 0) = %s, want the lower bound %s", tt.attempt, d, lo)
			}
			if d := tt.p.Delay(tt.attempt, 0.5); d != tt.center {
				t.Fatalf("Delay(%d, 0.5) = %s, want %s", tt.attempt, d, tt.center)
			}
			if d := tt.p.Delay(tt.attempt, math.Nextafter(1, 0)); d < lo || d > hi {
				t.Fatalf("Delay(%d, 1-ε) = %s, outside [%s, %s]", tt.attempt, d, lo, hi)
			}
			var minD, maxD time.Duration
			for i := 0; i < 2000; i++ {
				d := tt.p.Random(tt.attempt)
				if d < lo || d > hi {
					t.Fatalf("Random(%d) = %s, outside [%s, %s]", tt.attempt, d, lo, hi)
				}
				if i == 0 || d < minD {
					minD = d
				}
				if d > maxD {
					maxD = d
				}
			}
			if tt.p.Jitter == 0 || tt.center == 0 || tt.center == math.MaxInt64 {
				if minD != tt.center || maxD != tt.center {
					t.Fatalf("Random(%d) ranged over [%s, %s], want exactly %s", tt.attempt, minD, maxD, tt.center)
				}
				return
			}
			// 2000 uniform samples cover both halves of the jitter range.
			if minD >= tt.center || maxD <= tt.center {
				t.Fatalf("Random(%d) ranged over [%s, %s]: not jittered around %s", tt.attempt, minD, maxD, tt.center)
			}
			spread := float64(hi - lo)
			if float64(maxD-minD) < 0.8*spread {
				t.Fatalf("Random(%d) ranged over [%s, %s], less than 80%% of [%s, %s]", tt.attempt, minD, maxD, lo, hi)
			}
		})
	}
}

func TestDoubles(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Base: 250 * time.Millisecond, Max: time.Hour, Jitter: 0}
	prev, _ := p.Bounds(1)
	for attempt := 2; attempt <= 14; attempt++ {
		d, _ := p.Bounds(attempt)
		if d != 2*prev {
			t.Fatalf("Bounds(%d) = %s, want twice Bounds(%d) = %s", attempt, d, attempt-1, 2*prev)
		}
		prev = d
	}
	if d, _ := p.Bounds(15); d != time.Hour {
		t.Fatalf("Bounds(15) = %s, want the cap 1h", d)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		p       backoff.Policy
		wantErr string // "" for valid; else the field the error must name
	}{
		{"Default", backoff.Default, ""},
		{"NoJitter", backoff.Policy{Base: time.Second, Max: time.Second}, ""},
		{"AlmostFullJitter", backoff.Policy{Base: time.Second, Max: time.Second, Jitter: 0.99}, ""},
		{"ZeroBaseAndMax", backoff.Policy{Jitter: 0.1}, ""},
		{"ZeroBase", backoff.Policy{Max: time.Second}, ""},
		{"Zero", backoff.Policy{}, ""},
		{"NegativeBase", backoff.Policy{Base: -time.Second, Max: time.Second}, "Base"},
		{"NegativeBaseAndMax", backoff.Policy{Base: -time.Second, Max: -time.Second}, "Base"},
		{"NegativeMax", backoff.Policy{Max: -time.Nanosecond}, "Max"},
		{"MaxBelowBase", backoff.Policy{Base: time.Minute, Max: time.Second}, "Max"},
		{"ZeroMaxBelowBase", backoff.Policy{Base: time.Millisecond}, "Max"},
		{"NegativeJitter", backoff.Policy{Base: time.Second, Max: time.Second, Jitter: -0.1}, "Jitter"},
		{"FullJitter", backoff.Policy{Base: time.Second, Max: time.Second, Jitter: 1}, "Jitter"},
		{"NaNJitter", backoff.Policy{Base: time.Second, Max: time.Second, Jitter: math.NaN()}, "Jitter"},
		{"InfJitter", backoff.Policy{Base: time.Second, Max: time.Second, Jitter: math.Inf(1)}, "Jitter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.p.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("Validate() = nil, want an error naming %q", tt.wantErr)
			case tt.wantErr != "" && !strings.HasPrefix(err.Error(), "backoff: "+tt.wantErr+": "):
				t.Fatalf("Validate() = %q, want it to name %q", err, tt.wantErr)
			}
		})
	}
}

func TestSQLArgsKeepSubMilliseconds(t *testing.T) {
	t.Parallel()
	base, maxMS, jitter := backoff.Policy{Base: 1500 * time.Microsecond, Max: 10 * time.Minute, Jitter: 0.25}.SQLArgs()
	if base != 1.5 || maxMS != 600000 || jitter != 0.25 {
		t.Fatalf("SQLArgs() = %v, %v, %v; want 1.5, 600000, 0.25", base, maxMS, jitter)
	}
}
