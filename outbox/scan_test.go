package outbox

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestScanFrom checks a relay's bound on the claim index: from the front
// first, once a period and after a reset; else a second before the
// earliest row the last claim locked; never set by a claim that began
// before a reset.
func TestScanFrom(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clock := t0
	s := &scanFrom{every: time.Second, now: func() time.Time { return clock }}
	at := func(d time.Duration) pgtype.Timestamptz { return pgtype.Timestamptz{Time: t0.Add(d), Valid: true} }
	want := func(step string, got, want pgtype.Timestamptz) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: bound %+v, want %+v", step, got, want)
		}
	}

	b, tok := s.claim()
	want("first claim", b, fromStart)
	want("due timer before any row", s.due(), fromStart)
	s.found(at(10*time.Second), tok)
	b, tok = s.claim()
	want("next claim", b, at(9*time.Second))
	want("due timer", s.due(), at(9*time.Second))

	// A reset while a claim is under way: the claim does not set the bound.
	s.reset()
	s.found(at(20*time.Second), tok)
	want("due timer after a reset", s.due(), fromStart)
	b, tok = s.claim()
	want("claim after a reset", b, fromStart)
	s.found(at(20*time.Second), tok)
	b, _ = s.claim()
	want("claim after the claim from the front", b, at(19*time.Second))

	clock = clock.Add(time.Second)
	b, tok = s.claim()
	want("claim a period later", b, fromStart)
	s.found(at(5*time.Second), tok)
	b, _ = s.claim()
	want("claim after a late row", b, at(4*time.Second))

	// A clock that went back reads from the front rather than never.
	clock = t0
	b, _ = s.claim()
	want("claim after the clock went back", b, fromStart)
}
