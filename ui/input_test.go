package ui_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/task"
)

// pageSafe reports whether a page holds no control or bidirectional
// character but new lines and tabs.
func pageSafe(body string) bool {
	return termsafe.Safe(strings.NewReplacer("\n", "", "\t", "").Replace(body))
}

// TestHostileDataShowsVisibly: a kind, idempotency key, error, lease owner
// and payload written before names were checked (here by SQL) with a
// bidirectional override or terminal escapes show on every page as
// visible escapes: "abc\u202edef" reads as such, not as "abcfed".
func TestHostileDataShowsVisibly(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	const (
		kind  = "abc\u202edef"
		key   = "key\x1b[2J\u2066"
		owner = "w\u202e1"
		msg   = "boom \u202egnp.exe\x1b]0;x\a"
	)
	tk := b.create(t, task.NewTask{Kind: "placeholder", Payload: json.RawMessage(`{"note":"x\u202ey\u0085"}`)})
	if _, err := b.store.Start(b.ctx, owner, time.Minute, tk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Fail(b.ctx, owner, task.Failure{ID: tk.ID, Error: msg, Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE ingest_task SET kind = $1, idempotency_key = $2 WHERE id = $3`, kind, key, tk.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO ingest_kind (kind, paused, updated_by) VALUES ($1, true, $2)`, "k\u2067"+kind, owner); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XAdd(b.ctx, &redis.XAddArgs{Stream: b.dlqKey, Values: map[string]any{
		dlq.FieldTaskID: tk.ID.String(), dlq.FieldKind: kind, dlq.FieldLastError: msg, dlq.FieldAttemptCount: 1}}).Err(); err != nil {
		t.Fatal(err)
	}
	c := b.client(t)
	for _, path := range []string{"/ui/", "/ui/tasks", "/ui/tasks/" + tk.ID.String(), "/ui/tasks?kind=" + url.QueryEscape(kind),
		"/ui/tasks?q=" + url.QueryEscape(key), "/ui/dlq", "/ui/dlq?preview=1&kind=" + url.QueryEscape(kind), "/ui/kinds",
		"/ui/tasks?live=1", "/ui/kinds?live=1"} {
		p := c.get(path)
		want(t, p, 200, `abc\u202edef`)
		if !pageSafe(p.body) {
			t.Fatalf("GET %s shows control or bidirectional characters as they are:\n%q", path, clip(p.body))
		}
	}
	want(t, c.get("/ui/tasks/"+tk.ID.String()), 200, `key\x1b[2J\u2066`, `w\u202e1`, `boom \u202egnp.exe\x1b]0;x\a`, `x\u202ey\u0085`)
	want(t, c.get("/ui/kinds"), 200, `k\u2067abc\u202edef`)
}

// TestFiltersWithBadBytesAre400: a NUL or bytes that are not UTF-8 in a
// filter of the dashboard answer 400 with the field named (the tasks page
// showed PostgreSQL's error as a 500); a kind with a control or
// bidirectional character is refused by the kind settings; a cancel's
// reason with a NUL is refused, the task left as it was; a DLQ entry id
// that is none is not found (Redis's error was a 500).
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
		"/ui/dlq?after=garbage":              "after",
	} {
		p := c.get(path)
		want(t, p, 400, field)
		if !pageSafe(p.body) {
			t.Fatalf("GET %s: the page shows control characters as they are:\n%q", path, clip(p.body))
		}
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
	flash(c.post("/ui/tasks/"+f.queued.ID.String()+"/cancel", form("reason", "why\x00", "confirm", "yes")), "reason must not hold a NUL")
	// An entry id that is none: not found, not Redis's error as a 500.
	flash(c.post("/ui/dlq/replay", form("entry", "garbage")), "not a stream entry id")
	if s := b.status(t, f.queued.ID); s != task.Queued {
		t.Fatalf("after a refused cancel: %s, want QUEUED", s)
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ingest_kind`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d kind settings stored (%v), want none", n, err)
	}
}
