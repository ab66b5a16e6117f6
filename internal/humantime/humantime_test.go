package humantime

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond:        "850ms",
		12300 * time.Millisecond:      "12.3s",
		4*time.Minute + 5*time.Second: "4m05s",
		3*time.Hour + 2*time.Minute:   "3h02m",
		52 * time.Hour:                "2d04h",
		-(1500 * time.Millisecond):    "-1.5s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%s) = %q, want %q", d, got, want)
		}
	}
}

// TestFarTimes: a span beyond time.Duration's reach (about 292 years) is
// written as long as it is, not as the clamped 106751d23h, and the most
// negative duration does not recurse forever.
func TestFarTimes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	mark := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	const want = "7978y143d" // 2,912,113 days, in years of 365 days
	for _, c := range []struct{ got, want string }{
		{Between(now, mark), want},
		{Between(mark, now), "-" + want},
		{Relative(mark, now), "in " + want},
		{Relative(time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), now), "2027y089d ago"},
		{Relative(now.Add(90*time.Second), now), "in 1m30s"},
		{Relative(now.Add(-1500*time.Millisecond), now), "1.5s ago"},
		{Duration(400 * 24 * time.Hour), "1y035d"},
		{Duration(time.Duration(math.MinInt64)), "-292y171d"},
		{Duration(time.Duration(math.MaxInt64)), "292y171d"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
		if strings.Contains(c.got, "106751d") {
			t.Errorf("%q is a clamped duration", c.got)
		}
	}
}
