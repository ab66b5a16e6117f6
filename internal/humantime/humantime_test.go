package humantime

import (
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
