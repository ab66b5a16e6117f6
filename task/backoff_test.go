package task_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

func TestBackoffBounds(t *testing.T) {
	t.Parallel()
	pct := func(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }
	tests := []struct {
		name    string
		b       task.Backoff
		attempt int
		center  time.Duration // min(base*2^(attempt-1), max)
	}{
		{"FirstFailure", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 1, time.Second},
		{"ZeroCountsAsFirst", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 0, time.Second},
		{"NegativeCountsAsFirst", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, -3, time.Second},
		{"Second", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 2, 2 * time.Second},
		{"Third", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 3, 4 * time.Second},
		{"LastBelowCap", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 6, 32 * time.Second},
		{"Capped", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 7, time.Minute},
		{"CapExactlyReached", task.Backoff{Base: time.Second, Max: 4 * time.Second, Jitter: 0.25}, 3, 4 * time.Second},
		{"HugeAttemptStaysCapped", task.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.1}, 1000, time.Minute},
		{"MaxIntAttempt", task.Backoff{Base: time.Second, Max: time.Hour, Jitter: 0.1}, int(^uint(0) >> 1), time.Hour},
		{"MaxEqualsBase", task.Backoff{Base: 5 * time.Millisecond, Max: 5 * time.Millisecond, Jitter: 0.5}, 9, 5 * time.Millisecond},
		{"NoJitter", task.Backoff{Base: 100 * time.Millisecond, Max: time.Second, Jitter: 0}, 3, 400 * time.Millisecond},
		{"SubMillisecond", task.Backoff{Base: 1500 * time.Microsecond, Max: time.Second, Jitter: 0}, 2, 3 * time.Millisecond},
		{"Defaults", task.DefaultBackoff, 11, 10 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lo, hi := tt.b.Bounds(tt.attempt)
			wantLo, wantHi := pct(tt.center, 1-tt.b.Jitter), pct(tt.center, 1+tt.b.Jitter)
			if lo != wantLo || hi != wantHi {
				t.Fatalf("Bounds(%d) = [%s, %s], want [%s, %s]", tt.attempt, lo, hi, wantLo, wantHi)
			}
			if lo > hi || hi > pct(tt.b.Max, 1+tt.b.Jitter) {
				t.Fatalf("Bounds(%d) = [%s, %s] exceed the cap %s*(1+%v)", tt.attempt, lo, hi, tt.b.Max, tt.b.Jitter)
			}
			var minD, maxD time.Duration
			for i := 0; i < 2000; i++ {
				d := tt.b.Delay(tt.attempt)
				if d < lo || d > hi {
					t.Fatalf("Delay(%d) = %s, outside [%s, %s]", tt.attempt, d, lo, hi)
				}
				if i == 0 || d < minD {
					minD = d
				}
				if d > maxD {
					maxD = d
				}
			}
			if tt.b.Jitter == 0 {
				if minD != tt.center || maxD != tt.center {
					t.Fatalf("without jitter Delay(%d) ranged over [%s, %s], want exactly %s", tt.attempt, minD, maxD, tt.center)
				}
				return
			}
			// 2000 uniform samples cover both halves of the jitter range.
			if minD >= tt.center || maxD <= tt.center {
				t.Fatalf("Delay(%d) ranged over [%s, %s]: not jittered around %s", tt.attempt, minD, maxD, tt.center)
			}
			spread := float64(hi - lo)
			if float64(maxD-minD) < 0.8*spread {
				t.Fatalf("Delay(%d) ranged over [%s, %s], less than 80%% of [%s, %s]", tt.attempt, minD, maxD, lo, hi)
			}
		})
	}
}

func TestBackoffDoubles(t *testing.T) {
	t.Parallel()
	b := task.Backoff{Base: 250 * time.Millisecond, Max: time.Hour, Jitter: 0}
	prev, _ := b.Bounds(1)
	for attempt := 2; attempt <= 14; attempt++ {
		d, _ := b.Bounds(attempt)
		if d != 2*prev {
			t.Fatalf("Bounds(%d) = %s, want twice Bounds(%d) = %s", attempt, d, attempt-1, 2*prev)
		}
		prev = d
	}
	if d, _ := b.Bounds(15); d != time.Hour {
		t.Fatalf("Bounds(15) = %s, want the cap 1h", d)
	}
}

func TestBackoffValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		b       task.Backoff
		wantErr string // "" for valid
	}{
		{"Default", task.DefaultBackoff, ""},
		{"NoJitter", task.Backoff{Base: time.Second, Max: time.Second}, ""},
		{"AlmostFullJitter", task.Backoff{Base: time.Second, Max: time.Second, Jitter: 0.99}, ""},
		{"ZeroBase", task.Backoff{Max: time.Second}, "base"},
		{"NegativeBase", task.Backoff{Base: -time.Second, Max: time.Second}, "base"},
		{"MaxBelowBase", task.Backoff{Base: time.Minute, Max: time.Second}, "max"},
		{"NegativeJitter", task.Backoff{Base: time.Second, Max: time.Second, Jitter: -0.1}, "jitter"},
		{"FullJitter", task.Backoff{Base: time.Second, Max: time.Second, Jitter: 1}, "jitter"},
		{"NaNJitter", task.Backoff{Base: time.Second, Max: time.Second, Jitter: math.NaN()}, "jitter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.b.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("Validate() = nil, want an error naming %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("Validate() = %q, want it to name %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewStoreConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     task.Config
		wantErr string
	}{
		{"ZeroTakesDefaults", task.Config{}, ""},
		{"Custom", task.Config{Stream: "s", MaxAttempts: 1, MaxPayloadBytes: 2, Backoff: task.Backoff{Base: 1, Max: 1}}, ""},
		{"NegativeMaxAttempts", task.Config{MaxAttempts: -1}, "MaxAttempts"},
		{"TinyPayloadLimit", task.Config{MaxPayloadBytes: 1}, "MaxPayloadBytes"},
		{"BadBackoff", task.Config{Backoff: task.Backoff{Base: time.Second}}, "Backoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := task.NewStore(tt.cfg, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewStore() error = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewStore() = %v", err)
			}
			if tt.name == "ZeroTakesDefaults" {
				want := task.Config{Stream: task.DefaultStream, MaxAttempts: task.DefaultMaxAttempts,
					MaxPayloadBytes: task.DefaultMaxPayloadBytes, Backoff: task.DefaultBackoff}
				if got := s.Config(); got != want {
					t.Fatalf("Config() = %+v, want the defaults %+v", got, want)
				}
			}
		})
	}
}
