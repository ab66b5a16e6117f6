// Package humantime owns how durations are written for people, the same
// in the CLI's tables and on the dashboard: 850ms, 12.3s, 4m05s, 3h02m,
// 2d04h.
package humantime

import (
	"fmt"
	"time"
)

// Duration writes d short, to the unit that matters: milliseconds below a
// second, tenths of a second below a minute, then minutes and seconds,
// hours and minutes (below two days) and days and hours. A negative d gets
// a leading "-".
func Duration(d time.Duration) string {
	switch {
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
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}
