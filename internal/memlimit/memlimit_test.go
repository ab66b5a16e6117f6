package memlimit

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestLimit(t *testing.T) {
	for _, tc := range []struct {
		name          string
		floor         int64
		live, nonHeap uint64
		gogc          int64
		want          int64
	}{
		{"small heap: the floor", 88 << 20, 20 << 20, 45 << 20, 100, 88 << 20},
		{"large heap: twice the live heap and the rest", 88 << 20, 500 << 20, 50 << 20, 100, 1050 << 20},
		{"GOGC 50", 10, 100, 20, 50, 170},
		{"overflow", 10, math.MaxUint64, math.MaxUint64, 100, math.MaxInt64},
	} {
		if got := Limit(tc.floor, tc.live, tc.nonHeap, tc.gogc); got != tc.want {
			t.Errorf("%s: Limit = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestStartFollowsLiveHeap: the limit is the floor while the live heap is
// small, follows a live heap grown past it (twice the live heap, with
// GOGC 100), and is off again after stop; an operator's GOMEMLIMIT leaves
// it alone.
func TestStartFollowsLiveHeap(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if _, started := Start(env(map[string]string{"GOMEMLIMIT": "1GiB"}), 1<<20); started {
		t.Fatal("started with GOMEMLIMIT set")
	}
	if _, started := Start(env(map[string]string{"GOGC": "off"}), 1<<20); started {
		t.Fatal("started with GOGC=off")
	}
	const floor = 8 << 20
	stop, started := Start(env(nil), floor)
	if !started {
		t.Fatal("not started")
	}
	if got := debug.SetMemoryLimit(-1); got != floor {
		t.Fatalf("limit %d after Start, want the floor %d", got, floor)
	}
	// 64 MiB live: the limit must rise to at least twice that.
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	deadline := time.Now().Add(time.Minute)
	for debug.SetMemoryLimit(-1) < 128<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("limit %d with 64 MiB live, want >= 128 MiB", debug.SetMemoryLimit(-1))
		}
		runtime.GC()
		runtime.Gosched()
	}
	runtime.KeepAlive(live)
	stop()
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("limit %d after stop, want none", got)
	}
}
