// Package humantime owns how durations are written for people, the same
// in the CLI's tables and on the dashboard: 850ms, 12.3s, 4m05s, 3h02m,
// 2d04h, 1y035d. A duration between two times goes through Between or
// Relative, which write a span beyond time.Duration's reach (about 292
// years) as long as it is, where time.Time.Sub would clamp it.
package humantime

import (
	"fmt"
	"math"
	"time"
)

const day = 24 * time.Hour

// Duration writes d short, to the unit that matters: milliseconds below a
// second, tenths of a second below a minute, then minutes and seconds,
// hours and minutes (below two days), days and hours (below a year), and
// years of 365 days and days. A negative d gets a leading "-".
func Duration(d time.Duration) string {
	switch {
	case d == math.MinInt64:
		return "-" + Duration(math.MaxInt64) // -d would overflow
	case d < 0:
		return "-" + Duration(-d)
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	case d < 365*day:
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
	return years(int64(d / day))
}

// years writes a count of whole days of at least a year.
func years(days int64) string {
	return fmt.Sprintf("%dy%03dd", days/365, days%365)
}

// Between writes the time from a to b as Duration does (negative when b
// is before a). time.Time.Sub clamps a span beyond time.Duration's range
// (about 292 years) to that range; Between writes such a span in years
// and days from the times' seconds instead.
func Between(a, b time.Time) string {
	d := b.Sub(a)
	if a.Add(d).Equal(b) {
		return Duration(d)
	}
	secs := b.Unix() - a.Unix() // exact for any two times of years 1 to 9999
	if secs < 0 {
		return "-" + years(-secs/int64(day/time.Second))
	}
	return years(secs / int64(day/time.Second))
}

// Relative says how far t is from now: "in 3.0s" or "2m05s ago", however
// far (see Between).
func Relative(t, now time.Time) string {
	if t.Before(now) {
		return Between(t, now) + " ago"
	}
	return "in " + Between(now, t)
}
