package ui_test

import (
	"net/url"
	"testing"

	"github.com/ingest-worker/ingest/task"
)

// TestFiltersWithBadBytesAre400: a NUL or bytes that are not UTF-8 in a
// filter of the dashboard answer 400 with the field named (the tasks page
// showed PostgreSQL's error as a 500); a kind with a control or
// bidirectional character is refused by the kind settings; a cancel's
// reason with a NUL is refused, the task left as it was.
func TestFiltersWithBadBytesAre400(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)
	for path, field := range map[string]string{
		"/ui/tasks?kind=%00":                 "kind",
		"/ui/tasks?kind=a%00b":               "kind",
		"/ui/tasks?kind=%FF":                 "kind",
		"/ui/tasks?q=%00":                    "q",
		"/ui/tasks?q=a%FFb&kind=email":       "q",
		"/ui/dlq?preview=1&kind=a%00":        "kind",
		"/ui/dlq?preview=1&error=%00":        "error_contains",
		"/ui/dlq?preview=1&error=%C3":        "error_contains",
		"/ui/dlq?preview=1&limit=1e3":        "limit",
		"/ui/dlq?preview=1&limit=4294967297": "limit",
	} {
		want(t, c.get(path), 400, field)
	}
	csrf := c.csrf("/ui/")
	form := func(kv ...string) url.Values {
		v := url.Values{"csrf": {csrf}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	flash := func(p page, msg string) {
		t.Helper()
		want(t, p, 303)
		want(t, c.get(p.header.Get("Location")), 200, msg)
	}
	flash(c.post("/ui/kinds/"+url.PathEscape("esc\x1b[2J"), form("op", "pause")), `kind must not hold control or bidirectional characters, got \x1b`)
	flash(c.post("/ui/kinds/"+url.PathEscape("abc\u202edef"), form("op", "pause")), `got \u202e`)
	flash(c.post("/ui/kinds/email", form("op", "limits", "concurrency", "4294967297")), "concurrency must be a whole number from 0 to 100000")
	flash(c.post("/ui/tasks/"+f.queued.ID.String()+"/cancel", form("reason", "why\x00")), "reason must not hold a NUL")
	if s := b.status(t, f.queued.ID); s != task.Queued {
		t.Fatalf("after a refused cancel: %s, want QUEUED", s)
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ingest_kind`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d kind settings stored (%v), want none", n, err)
	}
}
