package maintenance_test

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
)

func TestStartDelayBounds(t *testing.T) {
	t.Parallel()
	const interval = time.Second
	for _, tc := range []struct {
		name   string
		jitter float64
		rnd    float64
		want   time.Duration
	}{
		{"NoJitter", 0, 0.9, 0},
		{"Lowest", 1, 0, 0},
		{"Half", 1, 0.5, interval / 2},
		{"FractionOfInterval", 0.25, 0.5, interval / 8},
		{"JitterAboveOneIsOne", 3, 0.5, interval / 2},
		{"NegativeJitterIsNone", -1, 0.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := maintenance.StartDelay(interval, tc.jitter, func() float64 { return tc.rnd }); got != tc.want {
				t.Fatalf("StartDelay(%s, %v) with rnd %v = %s, want %s", interval, tc.jitter, tc.rnd, got, tc.want)
			}
		})
	}
	// With the real source: always in [0, jitter × interval), and spread.
	var lowHalf, highHalf int
	for range 1000 {
		d := maintenance.StartDelay(interval, 0.5, rand.Float64)
		if d < 0 || d >= interval/2 {
			t.Fatalf("StartDelay(1s, 0.5) = %s, want in [0, 500ms)", d)
		}
		if d < interval/4 {
			lowHalf++
		} else {
			highHalf++
		}
	}
	if lowHalf < 400 || highHalf < 400 {
		t.Fatalf("delays not spread: %d below 250ms, %d above", lowHalf, highHalf)
	}
}

// TestLoopRunsUntilCancelled: without a start delay the first pass runs at
// once (with an interval of an hour, it still runs), then one per
// interval; passes never overlap, even when one takes longer than the
// interval; cancelling stops the loop, and no pass starts after it
// returned.
func TestLoopRunsUntilCancelled(t *testing.T) {
	t.Parallel()
	const interval = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	var runs, running, overlaps atomic.Int64
	var returned atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		maintenance.RunLoop(ctx, interval, 0, func(context.Context) {
			if returned.Load() {
				t.Error("a pass after the loop returned")
			}
			if running.Add(1) > 1 {
				overlaps.Add(1)
			}
			if runs.Add(1) == 3 {
				time.Sleep(3 * interval) // a slow pass
			}
			running.Add(-1)
		})
		returned.Store(true)
	}()
	testenv.Eventually(t, 5*time.Second, "10 passes", func() bool { return runs.Load() >= 10 })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not return after cancel")
	}
	n := runs.Load()
	if overlaps.Load() != 0 {
		t.Errorf("%d overlapping passes", overlaps.Load())
	}
	if runs.Load() != n {
		t.Errorf("passes went on after the loop returned")
	}

	// The first pass does not wait for an interval: with one of an hour,
	// it runs.
	hourCtx, hourCancel := context.WithCancel(context.Background())
	defer hourCancel()
	var hourRuns atomic.Int64
	go maintenance.RunLoop(hourCtx, time.Hour, 0, func(context.Context) { hourRuns.Add(1) })
	testenv.Eventually(t, 30*time.Second, "the first pass of a loop with an interval of an hour", func() bool { return hourRuns.Load() == 1 })
}

// TestLoopStartDelay: the first pass waits for the start delay, and a loop
// cancelled during it returns without any pass.
func TestLoopStartDelay(t *testing.T) {
	t.Parallel()
	const delay = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	first := make(chan time.Duration, 1)
	go maintenance.RunLoop(ctx, time.Hour, delay, func(context.Context) {
		select {
		case first <- time.Since(start):
		default:
		}
	})
	select {
	case d := <-first:
		if d < delay {
			t.Fatalf("first pass after %s, before the start delay %s", d, delay)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no pass after the start delay")
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	var ran atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		maintenance.RunLoop(ctx2, time.Hour, time.Hour, func(context.Context) { ran.Store(true) })
	}()
	cancel2()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not return when cancelled during its start delay")
	}
	if ran.Load() {
		t.Fatal("a pass ran although the loop was cancelled during its start delay")
	}
}

// TestFailedPassIsCounted: a failed pass counts on
// outbox_maintenance_errors_total{component}, a pass with nothing to do on
// nothing.
func TestFailedPassIsCounted(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	cfg := maintenance.Config{RescuerDisabled: true, ConsumersDisabled: true, Retention: maintenance.RetentionConfig{DisableTrim: true}}
	reg := prometheus.NewRegistry()
	m, err := maintenance.New(cfg, db.Pool, nil, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	maintenance.RunPass(ctx, m, "retention")
	if v := metricValue(t, reg, "outbox_maintenance_errors_total", "component", "retention"); v != 0 {
		t.Fatalf("errors after a pass with nothing to do = %v, want 0", v)
	}
	db.Pool.Close() // every statement fails from now on
	maintenance.RunPass(ctx, m, "retention")
	if v := metricValue(t, reg, "outbox_maintenance_errors_total", "component", "retention"); v != 1 {
		t.Fatalf("errors after a failed pass = %v, want 1", v)
	}
	if v := metricValue(t, reg, "outbox_maintenance_errors_total", "component", "rescuer"); v != 0 {
		t.Fatalf("rescuer errors = %v, want 0", v)
	}
}
