package ui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/task"
)

// login logs c in with token and returns a CSRF token of its session.
func login(t *testing.T, c *client, token string) string {
	t.Helper()
	csrf := c.csrf("/ui/login")
	want(t, c.post("/ui/login", url.Values{"csrf": {csrf}, "token": {token}}), 303)
	return c.csrf("/ui/")
}

// TestEveryStateChangingRouteRefusesCrossSite walks the handler's own
// route table, so that a route added later is covered without editing this
// test: every POST a browser sends on behalf of another site is refused with
// 403, with a valid session and CSRF token or without a token configured,
// and changes nothing.
func TestEveryStateChangingRouteRefusesCrossSite(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"", "s3cret-token"} {
		b := setup(t, options{token: token})
		f := b.fixture(t)
		c := b.client(t)
		var csrf string
		if token != "" {
			csrf = login(t, c, token)
		} else {
			csrf = c.csrf("/ui/")
		}
		fill := strings.NewReplacer("{id}", f.dead.ID.String(), "{kind}", "embed")
		var unsafe int
		for _, pattern := range b.h.Routes() {
			method, path, ok := strings.Cut(pattern, " ")
			if !ok {
				t.Fatalf("route %q has no method", pattern)
			}
			if method == http.MethodGet {
				continue
			}
			unsafe++
			path = fill.Replace(path)
			form := url.Values{"csrf": {csrf}, "token": {token}, "op": {"pause"}, "status": {"DEAD"}, "entry": {"1-1"}}
			for _, hdr := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Sec-Fetch-Site", "same-site"}, {"Origin", "https://evil.example"}, {"Origin", "null"}} {
				req, _ := http.NewRequest(method, c.base+path, strings.NewReader(form.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set(hdr[0], hdr[1])
				p := c.do(req)
				want(t, p, http.StatusForbidden, "cross-origin")
				if strings.Contains(p.header.Get("Set-Cookie"), "ingest_ui_session=") && !strings.Contains(p.header.Get("Set-Cookie"), "Max-Age=0") {
					t.Fatalf("%s %s with %s: %s set a session cookie", method, path, hdr[0], hdr[1])
				}
			}
		}
		if unsafe < 7 {
			t.Fatalf("only %d state-changing routes in %v", unsafe, b.h.Routes())
		}
		if s := b.status(t, f.dead.ID); s != task.Dead {
			t.Fatalf("token %q: status %s after refused requests", token, s)
		}
		if s := b.status(t, f.queued.ID); s != task.Queued {
			t.Fatalf("token %q: status %s after refused requests", token, s)
		}
		var paused int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ingest_kind WHERE paused`).Scan(&paused); err != nil || paused != 0 {
			t.Fatalf("paused kinds %d (%v)", paused, err)
		}
		// The session survived the refused logout.
		if token != "" {
			want(t, c.get("/ui/"), 200, "Overview")
		}
	}
}
