package ingest

import (
	"fmt"
	"testing"
	"time"
)

// TestHeldStartsShareOneStart: the messages of limited kinds that take
// handler slots while the start of another such message is under way are
// started together, in one call, once it returns, and nothing is started
// twice.
func TestHeldStartsShareOneStart(t *testing.T) {
	f := newInflight(4, 0, time.Minute)
	calls := make(chan []delivery)
	release := make(chan struct{})
	f.startHeld = func(ds []delivery) {
		calls <- ds
		<-release
	}
	d := func(i int) delivery { return delivery{id: fmt.Sprintf("1-%d", i)} }
	for i := range 4 {
		if held, _ := f.holdFor(d(i)); !held {
			t.Fatalf("message %d found no free handler slot of 4", i)
		}
	}
	for i := 4; i < 8; i++ {
		if held, queued := f.holdFor(d(i)); held || !queued {
			t.Fatalf("message %d: held %v, queued %v with every handler slot taken; want it queued", i, held, queued)
		}
	}
	ids := func(ds []delivery) []string {
		var out []string
		for _, d := range ds {
			out = append(out, d.id)
		}
		return out
	}

	f.handlerDone()
	if got := ids(receive(t, calls, "the first held start")); fmt.Sprint(got) != "[1-4]" {
		t.Fatalf("first held start got %v, want [1-4]", got)
	}
	// Three more slots free while that start is under way.
	for range 3 {
		f.handlerDone()
	}
	select {
	case ds := <-calls:
		t.Fatalf("a second start (%v) began while the first was under way", ids(ds))
	default:
	}
	release <- struct{}{}
	if got := ids(receive(t, calls, "the held starts gathered meanwhile")); fmt.Sprint(got) != "[1-5 1-6 1-7]" {
		t.Fatalf("the messages that took slots during the first start were started as %v, want [1-5 1-6 1-7] in one start", got)
	}
	release <- struct{}{}

	// Nothing waits now: a freed slot is free again, and a message that
	// waits later is started by a start of its own.
	deadline := time.Now().Add(30 * time.Second)
	for {
		f.mu.Lock()
		idle := !f.heldStarting
		f.mu.Unlock()
		if idle {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the held starts did not end with nothing left to start")
		}
		time.Sleep(time.Millisecond)
	}
	f.handlerDone()
	if n := f.freeCount(); n != 1 {
		t.Fatalf("%d free handler slots after one was given back with nothing waiting, want 1", n)
	}
	if held, _ := f.holdFor(d(8)); !held {
		t.Fatal("the freed handler slot was not free for the next message")
	}
	if _, queued := f.holdFor(d(9)); !queued {
		t.Fatal("message 9 was not queued with every handler slot taken")
	}
	f.handlerDone()
	if got := ids(receive(t, calls, "a later held start")); fmt.Sprint(got) != "[1-9]" {
		t.Fatalf("a later held start got %v, want [1-9]", got)
	}
	release <- struct{}{}
}
