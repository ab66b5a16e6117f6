package ingest

import (
	"context"
	"testing"
	"time"
)

// claimantsOf returns how many reclaim rounds wait for a slot of f.
func claimantsOf(f *inflight) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.claimants
}

// freeOne gives one message slot of f back, as a settled message does.
func freeOne(f *inflight) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.freeSlotsLocked(1)
}

// receive returns what ch gives, failing the test if it gives nothing
// within 30 s.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("waited 30s for %s", what)
		var zero T
		return zero
	}
}

// awaitClaimants waits until n reclaim rounds wait for a slot of f.
func awaitClaimants(t *testing.T, f *inflight, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for claimantsOf(f) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d reclaim rounds wait for a slot, want %d", claimantsOf(f), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReserveFirstTakesTheNextFreedSlot: a reclaim round waiting for a
// slot of a one-slot worker whose reader holds it gets the slot the reader
// frees, however quickly the reader asks again; readers reserve none while
// it waits, and again once it is served.
func TestReserveFirstTakesTheNextFreedSlot(t *testing.T) {
	f := newInflight(1, 0, time.Minute)
	if n := f.reserve(1); n != 1 {
		t.Fatalf("the reader reserved %d of 1 free slot", n)
	}
	got := make(chan int, 1)
	go func() { got <- f.reserveFirst(context.Background(), 10, time.Minute) }()
	awaitClaimants(t, f, 1)

	// The reader's read returns empty: its slot comes back, and it asks
	// for one again at once.
	freeOne(f)
	if n := f.reserve(1); n != 0 {
		t.Fatalf("the reader reserved %d slots while a reclaim round waited for one, want 0", n)
	}
	if n := receive(t, got, "the reclaim round's reservation"); n != 1 {
		t.Fatalf("the reclaim round reserved %d slots, want the 1 freed", n)
	}
	awaitClaimants(t, f, 0)
	if n := f.reserve(1); n != 0 {
		t.Fatalf("the reader reserved %d slots while the reclaim round held the only one", n)
	}
	freeOne(f)
	if n := f.reserve(1); n != 1 {
		t.Fatalf("the reader reserved %d slots after the reclaim round gave its slot back, want 1", n)
	}
}

// TestReserveFirstGivesUp: with no slot freed, a reclaim round's wait ends
// at its bound or when its context ends, with nothing reserved, and the
// readers reserve again; a free slot is taken at once, even while the
// readers gather freed slots for a bigger read.
func TestReserveFirstGivesUp(t *testing.T) {
	f := newInflight(1, 0, time.Minute)
	f.reserve(1)
	if n := f.reserveFirst(context.Background(), 1, 20*time.Millisecond); n != 0 {
		t.Fatalf("reserved %d slots with none free, want 0 after the wait", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan int, 1)
	go func() { got <- f.reserveFirst(ctx, 1, time.Hour) }()
	awaitClaimants(t, f, 1)
	cancel()
	if n := receive(t, got, "the end of the wait with its context"); n != 0 {
		t.Fatalf("reserved %d slots with none free, want 0 once its context ended", n)
	}
	awaitClaimants(t, f, 0)
	freeOne(f)
	if n := f.reserve(1); n != 1 {
		t.Fatalf("the reader reserved %d slots once no reclaim round waited, want 1", n)
	}

	// Tasks started ahead wait for handler slots: the readers gather freed
	// slots, a reclaim round does not wait for them.
	g := newInflight(4, 8, time.Minute)
	g.handlerTime = time.Millisecond // handlers return quickly: ahead slots on
	g.free = 1
	g.ready = make([]waiter, 2)
	if n := g.reserve(1); n != 0 {
		t.Fatalf("the reader reserved %d slots while gathering, want 0", n)
	}
	if n := g.reserveFirst(context.Background(), 5, time.Hour); n != 1 {
		t.Fatalf("the reclaim round reserved %d slots, want the 1 free at once", n)
	}
}

// TestTouchSkipsAbandonedRuns: a heartbeat lists the entries to refresh,
// then a run is abandoned (its handler ignored its timeout) before the
// refresh: the refresh leaves the abandoned run's entry alone (claiming
// it back would keep the task from being taken over until the reclaim
// idle time), and still refreshes the others.
func TestTouchSkipsAbandonedRuns(t *testing.T) {
	f := newInflight(2, 0, time.Minute)
	var listed []string
	runs := map[string]*run{}
	for _, id := range []string{"1-1", "1-2"} {
		f.ids[id] = true
		r := &run{d: delivery{id: id}}
		f.add(r)
		runs[id] = r
		listed = append(listed, id)
	}
	if !f.abandoned(runs["1-2"]) {
		t.Fatal("the run was not abandoned")
	}
	if got := f.live(listed); len(got) != 1 || got[0] != "1-1" {
		t.Fatalf("entries to refresh %v, want only 1-1 (1-2's run was abandoned)", got)
	}
}
