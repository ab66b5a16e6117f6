package ui_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/ui"
)

// TestLogoutEndsTheSession: after a logout the session cookie it ended is
// refused, by this process and by any other serving the dashboard on the
// same database, although its 12 hours have not passed.
func TestLogoutEndsTheSession(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	b := setup(t, options{token: token})
	f := b.fixture(t)
	// A second dashboard process on the same database (behind the same
	// load balancer).
	h2, err := ui.New(ui.Config{Store: b.store, DB: b.pool, Redis: b.rdb, Stream: b.stream, Group: "ingest-workers",
		DLQKey: b.dlqKey, Token: token, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv2 := httptest.NewServer(h2)
	t.Cleanup(srv2.Close)

	c := b.client(t)
	csrf := login(t, c, token)
	u := mustURL(t, b.srv.URL+"/ui/")
	old := cookieValue(t, c, u)
	// The session works on both processes.
	replay := func(base string) *client {
		t.Helper()
		other := b.client(t)
		other.base = base
		bu := mustURL(t, base+"/ui/")
		other.http.Jar.SetCookies(bu, []*http.Cookie{{Name: "ingest_ui_session", Value: old, Path: "/ui/"}, {Name: "ingest_ui_csrf", Value: csrf, Path: "/ui/"}})
		return other
	}
	want(t, replay(b.srv.URL).get("/ui/"), 200, "Overview")
	want(t, replay(srv2.URL).get("/ui/"), 200, "Overview")

	want(t, c.post("/ui/logout", url.Values{"csrf": {csrf}}), 303)
	want(t, c.get("/ui/"), 401, "Log in")
	// The old cookie, replayed (a copy in another browser, a stolen one):
	// refused for pages and actions, on both processes.
	for _, base := range []string{b.srv.URL, srv2.URL} {
		r := replay(base)
		want(t, r.get("/ui/"), 401, "Log in")
		want(t, r.get("/ui/tasks?live=1"), 401)
		want(t, r.post("/ui/tasks/"+f.queued.ID.String()+"/cancel", url.Values{"csrf": {csrf}}), 401)
	}
	if s := b.status(t, f.queued.ID); s != "QUEUED" {
		t.Fatalf("status %s after a cancel with an ended session", s)
	}
	// A new login works again.
	c2 := b.client(t)
	login(t, c2, token)
	want(t, c2.get("/ui/"), 200, "Overview")
}

// TestSessionRows: a login stores its session (hashed, with its expiry)
// and deletes the expired ones; with PostgreSQL unreachable a login
// answers "database unavailable" and sets no cookie.
func TestSessionRows(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	b := setup(t, options{token: token})
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO ingest_ui_session (id_hash, expires_at) VALUES ('\x01', now() - interval '1 second')`); err != nil {
		t.Fatal(err)
	}
	c := b.client(t)
	login(t, c, token)
	var n int
	var ttl float64
	err := b.pool.QueryRow(b.ctx, `SELECT count(*), max(extract(epoch FROM expires_at - created_at)) FROM ingest_ui_session`).Scan(&n, &ttl)
	if err != nil || n != 1 || ttl < ui.SessionTTL.Seconds()-60 || ttl > ui.SessionTTL.Seconds()+60 {
		t.Fatalf("%d session rows, TTL %.0f s (%v); want the login's, the expired one deleted", n, ttl, err)
	}

	pool, port := testenv.UnreachablePool(t)
	h, err := ui.New(ui.Config{Store: b.store, DB: pool, Token: token, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	c = b.client(t)
	csrf := c.csrf("/ui/login")
	p := c.post("/ui/login", url.Values{"csrf": {csrf}, "token": {token}})
	want(t, p, 503, "database unavailable")
	showsNone(t, "the login", p, "leakuser", "leakdb", port)
	if strings.Contains(p.header.Get("Set-Cookie"), "ingest_ui_session=") {
		t.Fatalf("a login that stored no session set a cookie: %s", p.header.Get("Set-Cookie"))
	}
}
