package ingest

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestRedelivererKeepsWhatItShould: a deferred delivery is kept only within
// the horizon, up to the bound, and not once stopped; those kept come out
// when due, earliest first, and not before, nor before redeliverRetry;
// one that found no free slot comes out again a little later, until it
// has been due for the horizon.
func TestRedelivererKeepsWhatItShould(t *testing.T) {
	now := time.Now()
	r := newRedeliverer()
	r.add(delivery{id: "far"}, now.Add(redeliverHorizon+time.Second), now)
	r.add(delivery{id: "b"}, now.Add(2*time.Second), now)
	r.add(delivery{id: "a"}, now.Add(time.Second), now)
	r.add(delivery{id: "c"}, now.Add(3*time.Second), now)
	if got := deliveryIDs(r.take(now)); len(got) != 0 {
		t.Errorf("took %v before any was due", got)
	}
	if got := deliveryIDs(r.take(now.Add(2 * time.Second))); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("took %v at +2s, want [a b]", got)
	}
	if got := deliveryIDs(r.take(now.Add(time.Hour))); !slices.Equal(got, []string{"c"}) {
		t.Errorf("took %v at +1h, want [c] (far was beyond the horizon)", got)
	}

	for i := range maxRedeliveries + 5 {
		r.add(delivery{id: fmt.Sprint(i)}, now, now)
	}
	if got := len(r.take(now.Add(time.Second))); got != maxRedeliveries {
		t.Errorf("kept %d, want the bound %d", got, maxRedeliveries)
	}

	// Due now, or already past (a database clock behind this one): kept
	// for redeliverRetry at least, so that it cannot loop.
	r.add(delivery{id: "now"}, now.Add(-time.Second), now)
	if got := deliveryIDs(r.take(now)); len(got) != 0 {
		t.Errorf("took %v at once, want it after redeliverRetry", got)
	}
	soon := now.Add(redeliverRetry)
	if got := deliveryIDs(r.take(soon)); !slices.Equal(got, []string{"now"}) {
		t.Errorf("took %v after redeliverRetry, want [now]", got)
	}

	// Found no free slot: tried again a little later, until it has been
	// due for the horizon.
	r.add(delivery{id: "busy"}, now, now)
	r.again(r.take(soon), soon)
	if got := deliveryIDs(r.take(soon)); len(got) != 0 {
		t.Errorf("took %v again at once, want it after redeliverRetry", got)
	}
	again := r.take(soon.Add(redeliverRetry))
	if got := deliveryIDs(again); !slices.Equal(got, []string{"busy"}) {
		t.Errorf("took %v after redeliverRetry, want [busy]", got)
	}
	r.again(again, soon.Add(redeliverHorizon))
	if got := deliveryIDs(r.take(now.Add(time.Hour))); len(got) != 0 {
		t.Errorf("took %v, due for the whole horizon already: want none", got)
	}

	r.add(delivery{id: "x"}, now, now)
	r.stop()
	r.add(delivery{id: "y"}, now, now)
	if got := deliveryIDs(r.take(now.Add(time.Hour))); len(got) != 0 {
		t.Errorf("took %v after stop, want none", got)
	}
}

// TestRedelivererRunsOnTime: run passes each delivery to deliver when it
// falls due, including one added with an earlier time than those waiting,
// and returns on stop.
func TestRedelivererRunsOnTime(t *testing.T) {
	r := newRedeliverer()
	got := make(chan delivery, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(func(ds []delivery) int {
			for _, d := range ds {
				got <- d
			}
			return len(ds)
		})
	}()
	now := time.Now()
	r.add(delivery{id: "late"}, now.Add(30*time.Second), now)
	r.add(delivery{id: "soon"}, now.Add(50*time.Millisecond), now)
	select {
	case d := <-got:
		if d.id != "soon" {
			t.Errorf("first delivered %q, want soon", d.id)
		}
		if early := time.Since(now); early < 50*time.Millisecond {
			t.Errorf("delivered after %s, before its time", early)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("soon was not delivered within 10 s")
	}
	r.stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10 s of stop")
	}
	select {
	case d := <-got:
		t.Errorf("delivered %q after stop", d.id)
	default:
	}
}

func deliveryIDs(ds []due) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.d.id)
	}
	return out
}
