package ui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ingest-worker/ingest/task"
)

// funcs are the template helpers.
var funcs = template.FuncMap{
	"ago":      ago,
	"dur":      human,
	"ms":       func(ms int64) string { return human(time.Duration(ms) * time.Millisecond) },
	"when":     when,
	"whenp":    func(t *time.Time) string { return whenPtr(t) },
	"clip":     clip,
	"pretty":   pretty,
	"num":      num,
	"lower":    strings.ToLower,
	"states":   func() []task.State { return task.States },
	"waiting":  func(s task.State) bool { return s == task.Queued || s == task.Retrying || s == task.Running },
	"final":    func(s task.State) bool { return s == task.Dead || s == task.Cancelled },
	"deref":    func(p *int) int { return *p },
	"relative": relative,
	"deref2":   func(t *time.Time) time.Time { return *t },
	"int64":    func(n int) int64 { return int64(n) },
	"countCap": func() int64 { return CountCap },
	"kindCap":  func() int64 { return KindCap },
	"sub":      func(a, b int) int { return a - b },
	"pathesc":  url.PathEscape,
	"count":    func(m map[task.State]int64, s string) int64 { return m[task.State(s)] },
}

// ago says how long ago t was: "3.2s ago", "5m10s ago".
func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return relative(t)
}

func relative(t time.Time) string {
	d := time.Until(t)
	if d >= 0 {
		return "in " + human(d)
	}
	return human(-d) + " ago"
}

// human writes a duration short: 850ms, 3.2s, 5m10s, 2h05m, 3d04h.
func human(d time.Duration) string {
	switch {
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

// when writes a time in UTC to the millisecond.
func when(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func whenPtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return when(*t)
}

// clip cuts s to n runes, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// pretty indents a JSON document (a payload) for reading; the template
// escapes the result.
func pretty(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

// num writes an integer with thin separators: 1 234 567.
func num(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune(' ')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
