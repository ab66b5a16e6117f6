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

	"github.com/ingest-worker/ingest/internal/humantime"
	"github.com/ingest-worker/ingest/task"
)

// funcs are the template helpers.
var funcs = template.FuncMap{
	"ago":      ago,
	"dur":      humantime.Duration,
	"ms":       func(ms int64) string { return humantime.Duration(time.Duration(ms) * time.Millisecond) },
	"when":     when,
	"whenp":    func(t *time.Time) string { return whenPtr(t) },
	"clip":     clip,
	"pretty":   pretty,
	"num":      num,
	"count1":   count1,
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
	"dueLater": dueLater,
	"graphMax": func() int { return GraphMax },
}

// ago says how long ago t was: "3.2s ago", "5m10s ago".
func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return relative(t)
}

func relative(t time.Time) string { return humantime.Relative(t, time.Now()) }

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
// count1 is n (as num writes it) and the noun of one or of many: "1
// entry", "2 entries", "0 tasks".
func count1(n any, one, many string) string {
	var v int64
	switch x := n.(type) {
	case int:
		v = int64(x)
	case int64:
		v = x
	}
	if v == 1 {
		return num(v) + " " + one
	}
	return num(v) + " " + many
}

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
