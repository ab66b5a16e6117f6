package ui_test

import (
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/ui"
)

// showsNone fails when the page shows any of secrets.
func showsNone(t *testing.T, what string, p page, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(p.body, s) {
			t.Fatalf("%s shows %q:\n%s", what, s, clip(p.body))
		}
	}
}

// TestDatabaseUnavailablePage: with PostgreSQL unreachable every page and
// action answers a plain "database unavailable" page, 503 with
// Retry-After, that shows neither the connection's user, database, host
// nor port.
func TestDatabaseUnavailablePage(t *testing.T) {
	t.Parallel()
	pool, port := testenv.UnreachablePool(t)
	store, err := task.NewStore(task.Config{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.New(ui.Config{Store: store, DB: pool, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	b := &bundle{srv: srv, h: h}
	c := b.client(t)
	secrets := []string{"leakuser", "leakpw", "leakdb", "127.0.0.1", port}
	id := uuid.NewString()
	for _, path := range []string{"/ui/", "/ui/?live=1", "/ui/tasks", "/ui/tasks?q=order-42", "/ui/tasks?q=" + id, "/ui/tasks/" + id, "/ui/dlq?preview=1&status=DEAD", "/ui/kinds"} {
		p := c.get(path)
		want(t, p, 503, "database unavailable")
		if p.header.Get("Retry-After") == "" {
			t.Fatalf("GET %s: 503 without Retry-After", path)
		}
		showsNone(t, "GET "+path, p, secrets...)
	}
	// The pages set the CSRF cookie before they failed.
	var csrf string
	for _, ck := range c.http.Jar.Cookies(mustURL(t, srv.URL+"/ui/")) {
		if ck.Name == "ingest_ui_csrf" {
			csrf = ck.Value
		}
	}
	for _, path := range []string{"/ui/tasks/" + id + "/cancel", "/ui/tasks/" + id + "/redrive", "/ui/dlq/redrive", "/ui/kinds/embed", "/ui/tasks/bulk"} {
		p := c.post(path, url.Values{"csrf": {csrf}, "op": {"pause"}, "status": {"DEAD"}, "confirm": {"yes"}, "action": {"cancel"}, "id": {id}})
		want(t, p, 503, "database unavailable")
		showsNone(t, "POST "+path, p, secrets...)
	}
}

// TestRedisUnavailableShowsNoAddress: with Redis unreachable the pages
// still show PostgreSQL's side and say that Redis is unavailable, without
// its address; a redrive's message too.
func TestRedisUnavailableShowsNoAddress(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	port := testenv.ClosedPort(t)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	h, err := ui.New(ui.Config{Store: b.store, DB: b.pool, Redis: rdb, Stream: b.stream, Group: "ingest-workers", DLQKey: b.dlqKey,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	c := b.client(t)
	for _, path := range []string{"/ui/", "/ui/tasks/" + f.dead.ID.String(), "/ui/dlq"} {
		p := c.get(path)
		want(t, p, 200, "Redis unavailable")
		showsNone(t, "GET "+path, p, "127.0.0.1", port, "dial tcp")
	}
	csrf := c.csrf("/ui/")
	want(t, c.post("/ui/tasks/"+f.dead.ID.String()+"/redrive", url.Values{"csrf": {csrf}}), 303)
	p := c.get("/ui/tasks/" + f.dead.ID.String())
	want(t, p, 200, "Redis unavailable")
	showsNone(t, "the redrive's message", p, "127.0.0.1", port, "dial tcp")
	if s := b.status(t, f.dead.ID); s != task.Queued {
		t.Fatalf("status %s after the redrive", s)
	}
}
