package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/humantime"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/ui"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	store  *task.Store
	rdb    *redis.Client
	stream string
	dlqKey string
	srv    *httptest.Server
	h      *ui.Handler
}

type options struct {
	token    string
	readOnly bool
	keyring  *seal.Keyring // encryption at rest
}

func setup(t *testing.T, o options) *bundle {
	t.Helper()
	db := testenv.NewDatabase(t)
	store, err := task.NewStore(task.Config{Keyring: o.keyring}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{ctx: context.Background(), pool: db.Pool, store: store, rdb: testenv.Redis(t)}
	b.stream, b.dlqKey = testenv.Keys(t)
	b.h, err = ui.New(ui.Config{Store: store, DB: db.Pool, Redis: b.rdb, Stream: b.stream, Group: "ingest-workers",
		DLQKey: b.dlqKey, Token: o.token, ReadOnly: o.readOnly, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		Retention: task.Windows{Succeeded: 24 * time.Hour, Cancelled: task.KeepForever, Dead: 168 * time.Hour},
		Periodic: func(now time.Time) []maintenance.Slot {
			return []maintenance.Slot{{Name: "nightly", Kind: "report", At: now.Add(time.Hour).Truncate(time.Hour), IdempotencyKey: "periodic:nightly"}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(b.h)
	t.Cleanup(b.srv.Close)
	return b
}

// testWriter sends a handler's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// client is a browser: it keeps cookies and does not follow redirects.
type client struct {
	t    *testing.T
	base string
	http *http.Client
}

func (b *bundle) client(t *testing.T) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: b.srv.URL, http: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	code   int
	body   string
	header http.Header
}

func (c *client) do(req *http.Request) page {
	c.t.Helper()
	resp, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{code: resp.StatusCode, body: string(body), header: resp.Header}
}

func (c *client) get(path string) page {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.base+path, nil)
	return c.do(req)
}

// post sends a form; headers are extra request headers.
func (c *client) post(path string, form url.Values, headers ...string) page {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return c.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" (?:value|content)="([^"]+)"`)

// csrf loads path and returns the page's CSRF token.
func (c *client) csrf(path string) string {
	c.t.Helper()
	p := c.get(path)
	m := csrfRE.FindStringSubmatch(p.body)
	if m == nil {
		c.t.Fatalf("GET %s (%d): no CSRF field in the page", path, p.code)
	}
	return m[1]
}

func want(t *testing.T, p page, code int, contains ...string) {
	t.Helper()
	if p.code != code {
		t.Fatalf("status %d, want %d; body:\n%s", p.code, code, clip(p.body))
	}
	for _, s := range contains {
		if !strings.Contains(p.body, s) {
			t.Fatalf("the page lacks %q; body:\n%s", s, clip(p.body))
		}
	}
}

func clip(s string) string {
	if len(s) > 4000 {
		return s[:4000] + "…"
	}
	return s
}

func (b *bundle) create(t *testing.T, nt task.NewTask) task.Task {
	t.Helper()
	if nt.Payload == nil {
		nt.Payload = json.RawMessage(`{"n":1}`)
	}
	r, err := b.store.Create(b.ctx, nt)
	if err != nil {
		t.Fatal(err)
	}
	return r.Task
}

// kill starts the task and fails it permanently with msg, and writes its
// DLQ entry as a worker would.
func (b *bundle) kill(t *testing.T, id uuid.UUID, msg string) {
	t.Helper()
	if _, err := b.store.Start(b.ctx, "w1", time.Minute, id); err != nil {
		t.Fatal(err)
	}
	rs, err := b.store.Fail(b.ctx, "w1", task.Failure{ID: id, Error: msg, Permanent: true})
	if err != nil || !rs[0].Applied {
		t.Fatalf("Fail: %v %+v", err, rs)
	}
	tk, err := b.store.Get(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	err = b.rdb.XAdd(b.ctx, &redis.XAddArgs{Stream: b.dlqKey, Values: map[string]any{
		dlq.FieldTaskID: id.String(), dlq.FieldKind: tk.Kind, dlq.FieldAttemptCount: tk.AttemptCount,
		dlq.FieldLastError: msg, dlq.FieldSourceID: "1-1", dlq.FieldDeadAt: tk.FinishedAt.UTC().Format(time.RFC3339Nano)}}).Err()
	if err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) status(t *testing.T, id uuid.UUID) task.State {
	t.Helper()
	var s task.State
	if err := b.pool.QueryRow(b.ctx, `SELECT status FROM ingest_task WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *bundle) dlqLen(t *testing.T) int64 {
	t.Helper()
	n, err := b.rdb.XLen(b.ctx, b.dlqKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fixture creates a queued, a delayed (parked until later), a dead and a
// cancelled task.
type fixture struct {
	queued, delayed, dead, cancelled task.Task
}

func (b *bundle) fixture(t *testing.T) fixture {
	t.Helper()
	var f fixture
	f.queued = b.create(t, task.NewTask{Kind: "email", IdempotencyKey: "order-42", Payload: json.RawMessage(`{"to":"a@example.com"}`)})
	f.delayed = b.create(t, task.NewTask{Kind: "email", Delay: time.Hour})
	f.dead = b.create(t, task.NewTask{Kind: "embed"})
	b.kill(t, f.dead.ID, "upstream 503")
	f.cancelled = b.create(t, task.NewTask{Kind: "embed"})
	if _, err := b.store.Cancel(b.ctx, "test", "not needed", f.cancelled.ID); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestPages(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)

	want(t, c.get("/ui/"), 200, "Overview", "QUEUED", "DEAD", "Throughput", "<svg", "Outbox backlog", "email", "embed")
	want(t, c.get("/ui/?live=1"), 200, `id="live"`, `hx-trigger="every 2s"`)
	if p := c.get("/ui/?live=1"); strings.Contains(p.body, "<html") {
		t.Fatal("the live part is a whole document")
	}
	want(t, c.get("/ui/tasks"), 200, f.queued.ID.String(), f.dead.ID.String(), "upstream 503")
	p := c.get("/ui/tasks?status=DEAD")
	want(t, p, 200, f.dead.ID.String())
	if strings.Contains(p.body, f.queued.ID.String()) {
		t.Fatal("status=DEAD lists a QUEUED task")
	}
	want(t, c.get("/ui/tasks?q="+f.queued.ID.String()), 200, f.queued.ID.String())
	want(t, c.get("/ui/tasks?q=order-42"), 200, f.queued.ID.String())
	want(t, c.get("/ui/tasks?q=order-42&kind=embed"), 200, "No task has")
	want(t, c.get("/ui/tasks?since="+url.QueryEscape(time.Now().Add(time.Hour).UTC().Format("2006-01-02T15:04"))), 200, "No tasks match")
	want(t, c.get("/ui/tasks?status=NOPE"), 400, "is not one of")
	want(t, c.get("/ui/tasks?since=yesterday"), 400, "is not a time")
	want(t, c.get("/ui/tasks?cursor=garbage"), 400, "cursor")

	want(t, c.get("/ui/tasks/"+f.dead.ID.String()), 200, "Audit timeline", "Outbox rows", "PEL entry", "DLQ entry",
		"upstream 503", "1-1", `id="redrive"`)
	want(t, c.get("/ui/tasks/"+f.queued.ID.String()), 200, `id="cancel"`, "order-42", "a@example.com")
	want(t, c.get("/ui/tasks/"+f.queued.ID.String()+"?live=1"), 200, "Audit timeline")
	want(t, c.get("/ui/tasks/"+uuid.NewString()), 404, "no task")
	want(t, c.get("/ui/tasks/nope"), 400, "not a task id")

	want(t, c.get("/ui/dlq"), 200, "1 entry", f.dead.ID.String()[:8], "upstream 503")
	want(t, c.get("/ui/dlq?kind=email"), 200, "No entries match")
	want(t, c.get("/ui/dlq?preview=1&kind=embed"), 200, "Dry run", "<strong>1</strong>", f.dead.ID.String(), `id="redrive-all"`)
	want(t, c.get("/ui/dlq?preview=1&status=CANCELLED"), 200, f.cancelled.ID.String())
	want(t, c.get("/ui/dlq?preview=1&limit=0"), 400, "limit")
	want(t, c.get("/ui/kinds"), 200, "email", "embed", `id="pause-email"`, "Periodic schedules", "periodic:nightly")
	want(t, c.get("/ui/kinds?live=1"), 200, "email")
	want(t, c.get("/ui/nope"), 404)

	for _, path := range []string{"/ui/static/htmx.min.js", "/ui/static/style.css"} {
		p := c.get(path)
		if p.code != 200 || len(p.body) < 1000 {
			t.Fatalf("GET %s: %d, %d bytes", path, p.code, len(p.body))
		}
	}
	// Every page names its assets on this server only.
	home := c.get("/ui/").body
	if strings.Contains(home, "http://") || strings.Contains(home, "https://") {
		t.Fatal("the page refers to another site")
	}
	if csp := c.get("/ui/").header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Fatalf("Content-Security-Policy %q", csp)
	}
}

func TestEscaping(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	const evil = `<script>alert(1)</script>`
	tk := b.create(t, task.NewTask{Kind: "k" + evil, IdempotencyKey: evil, Payload: json.RawMessage(`{"html":"` + evil + `"}`)})
	b.kill(t, tk.ID, evil)
	c := b.client(t)
	for _, path := range []string{"/ui/", "/ui/tasks", "/ui/tasks/" + tk.ID.String(), "/ui/tasks?q=" + url.QueryEscape(evil),
		"/ui/dlq", "/ui/dlq?preview=1", "/ui/kinds", "/ui/tasks?kind=" + url.QueryEscape(evil)} {
		p := c.get(path)
		want(t, p, 200, "&lt;script&gt;alert(1)&lt;/script&gt;")
		if strings.Contains(p.body, "<script>alert") {
			t.Fatalf("GET %s renders the payload as markup:\n%s", path, clip(p.body))
		}
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	b := setup(t, options{token: token})
	f := b.fixture(t)
	c := b.client(t)

	// No session: the login form, 401, on every page; assets stay open.
	for _, path := range []string{"/ui/", "/ui/tasks", "/ui/tasks/" + f.queued.ID.String(), "/ui/dlq", "/ui/kinds"} {
		p := c.get(path)
		want(t, p, 401, "Log in", `name="token"`)
		for _, secret := range []string{"Audit timeline", "a@example.com", "upstream 503", "QUEUED"} {
			if strings.Contains(p.body, secret) {
				t.Fatalf("GET %s without a session shows %q", path, secret)
			}
		}
	}
	want(t, c.get("/ui/static/style.css"), 200)
	// An action without a session: 401, nothing changes.
	csrf := c.csrf("/ui/login")
	want(t, c.post("/ui/tasks/"+f.queued.ID.String()+"/cancel", url.Values{"csrf": {csrf}}), 401)
	if s := b.status(t, f.queued.ID); s != task.Queued {
		t.Fatalf("status %s after an unauthenticated cancel", s)
	}
	// A wrong token: 401 again, with a message.
	want(t, c.post("/ui/login", url.Values{"csrf": {csrf}, "token": {"wrong"}, "next": {"/ui/kinds"}}), 401, "not the one")
	// A login without the CSRF token: 403.
	want(t, c.post("/ui/login", url.Values{"token": {token}}), 403)
	// The right token: a session cookie, a redirect to where we were going
	// (never off the site).
	p := c.post("/ui/login", url.Values{"csrf": {csrf}, "token": {token}, "next": {"/ui/kinds"}})
	want(t, p, 303)
	if loc := p.header.Get("Location"); loc != "/ui/kinds" {
		t.Fatalf("Location %q", loc)
	}
	sc := p.header.Get("Set-Cookie")
	for _, attr := range []string{"ingest_ui_session=", "HttpOnly", "SameSite=Strict", "Path=/ui/"} {
		if !strings.Contains(sc, attr) {
			t.Fatalf("session cookie %q lacks %s", sc, attr)
		}
	}
	want(t, c.get("/ui/"), 200, "Overview", "Log out")
	want(t, c.get("/ui/tasks"), 200, f.queued.ID.String())
	// The session works for actions too.
	csrf = c.csrf("/ui/tasks/" + f.queued.ID.String())
	want(t, c.post("/ui/tasks/"+f.queued.ID.String()+"/cancel", url.Values{"csrf": {csrf}, "confirm": {"yes"}}), 303)
	if s := b.status(t, f.queued.ID); s != task.Cancelled {
		t.Fatalf("status %s after a cancel with a session", s)
	}

	// Forged or foreign cookies are refused.
	other := b.client(t)
	u, _ := url.Parse(b.srv.URL + "/ui/")
	for _, v := range []string{"garbage", "9999999999.abc.def", strings.Replace(cookieValue(t, c, u), ".", "x.", 1)} {
		other.http.Jar.SetCookies(u, []*http.Cookie{{Name: "ingest_ui_session", Value: v, Path: "/ui/"}})
		want(t, other.get("/ui/"), 401, "Log in")
	}
	// A session of a server with another token is refused.
	b2 := setup(t, options{token: "another"})
	c2 := b2.client(t)
	c2.http.Jar.SetCookies(mustURL(t, b2.srv.URL+"/ui/"), []*http.Cookie{{Name: "ingest_ui_session", Value: cookieValue(t, c, u), Path: "/ui/"}})
	want(t, c2.get("/ui/"), 401)
	// An open redirect is not followed.
	csrf = other.csrf("/ui/login")
	p = other.post("/ui/login", url.Values{"csrf": {csrf}, "token": {token}, "next": {"//evil.example/"}})
	if loc := p.header.Get("Location"); p.code != 303 || loc != "/ui/" {
		t.Fatalf("login with next=//evil.example/: %d, Location %q", p.code, loc)
	}
	// Logging out forgets the session.
	csrf = c.csrf("/ui/")
	want(t, c.post("/ui/logout", url.Values{"csrf": {csrf}}), 303)
	want(t, c.get("/ui/"), 401)
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func cookieValue(t *testing.T, c *client, u *url.URL) string {
	t.Helper()
	for _, ck := range c.http.Jar.Cookies(u) {
		if ck.Name == "ingest_ui_session" {
			return ck.Value
		}
	}
	t.Fatal("no session cookie")
	return ""
}

// tampered returns s with its first byte changed to another: a token one
// byte off, never the token itself (a fixed replacement would be it
// whenever the token began with that byte).
func tampered(s string) string {
	b := []byte(s)
	if b[0] == 'x' {
		b[0] = 'y'
	} else {
		b[0] = 'x'
	}
	return string(b)
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)
	path := "/ui/tasks/" + f.queued.ID.String() + "/cancel"
	csrf := c.csrf("/ui/tasks/" + f.queued.ID.String())
	// No token, a wrong one, a cross-site request with the right one, a
	// browser without the cookie: all 403, nothing changed.
	want(t, c.post(path, url.Values{}), 403, "CSRF")
	want(t, c.post(path, url.Values{"csrf": {tampered(csrf)}}), 403, "CSRF")
	want(t, c.post(path, url.Values{"csrf": {csrf}}, "Sec-Fetch-Site", "cross-site"), 403, "cross-origin")
	want(t, c.post(path, url.Values{"csrf": {csrf}}, "Origin", "https://evil.example"), 403, "cross-origin")
	want(t, b.client(t).post(path, url.Values{"csrf": {csrf}}), 403, "CSRF")
	for _, p := range []string{"/ui/dlq/redrive", "/ui/dlq/replay", "/ui/kinds/email"} {
		want(t, c.post(p, url.Values{"op": {"pause"}, "entry": {"1-1"}}), 403)
	}
	if s := b.status(t, f.queued.ID); s != task.Queued {
		t.Fatalf("status %s after refused cancels", s)
	}
	// The right token from this site: done.
	want(t, c.post(path, url.Values{"csrf": {csrf}, "confirm": {"yes"}}, "Sec-Fetch-Site", "same-origin"), 303)
	if s := b.status(t, f.queued.ID); s != task.Cancelled {
		t.Fatalf("status %s, want CANCELLED", s)
	}
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, options{readOnly: true})
	f := b.fixture(t)
	c := b.client(t)
	for path, buttons := range map[string][]string{
		"/ui/tasks/" + f.queued.ID.String(): {"/cancel", `id="cancel"`},
		"/ui/tasks/" + f.dead.ID.String():   {"/redrive", `id="redrive"`},
		"/ui/dlq?preview=1":                 {"/ui/dlq/redrive", "/ui/dlq/replay"},
		"/ui/kinds":                         {"Pause", `name="concurrency"`},
	} {
		p := c.get(path)
		want(t, p, 200, "read-only")
		for _, s := range buttons {
			if strings.Contains(p.body, s) {
				t.Fatalf("read-only %s shows %q", path, s)
			}
		}
	}
	csrf := c.csrf("/ui/")
	for _, p := range []string{"/ui/tasks/" + f.queued.ID.String() + "/cancel", "/ui/tasks/" + f.dead.ID.String() + "/redrive",
		"/ui/dlq/redrive", "/ui/dlq/replay", "/ui/kinds/email"} {
		want(t, c.post(p, url.Values{"csrf": {csrf}, "op": {"pause"}, "status": {"DEAD"}}), 403, "read-only")
	}
	if s := b.status(t, f.queued.ID); s != task.Queued {
		t.Fatalf("status %s", s)
	}
	if s := b.status(t, f.dead.ID); s != task.Dead {
		t.Fatalf("status %s", s)
	}
	var paused int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ingest_kind WHERE paused`).Scan(&paused); err != nil || paused != 0 {
		t.Fatalf("paused kinds %d (%v)", paused, err)
	}
}

func TestActions(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)
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

	// Cancel with a reason, recorded in the audit trail.
	flash(c.post("/ui/tasks/"+f.delayed.ID.String()+"/cancel", form("reason", "customer withdrew", "confirm", "yes")), "Task cancelled.")
	if s := b.status(t, f.delayed.ID); s != task.Cancelled {
		t.Fatalf("status %s", s)
	}
	var by, reason string
	if err := b.pool.QueryRow(b.ctx, `SELECT cancel_requested_by, cancel_reason FROM ingest_task WHERE id = $1`, f.delayed.ID).Scan(&by, &reason); err != nil ||
		by != ui.DefaultActor || reason != "customer withdrew" {
		t.Fatalf("cancel by %q reason %q (%v)", by, reason, err)
	}
	flash(c.post("/ui/tasks/"+f.delayed.ID.String()+"/cancel", form()), "Not cancelled: tick the confirmation box first.")
	flash(c.post("/ui/tasks/"+f.delayed.ID.String()+"/cancel", form("confirm", "yes")), "only QUEUED, RETRYING and RUNNING")

	// Redrive of a DEAD task removes its DLQ entry.
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("DLQ length %d", n)
	}
	flash(c.post("/ui/tasks/"+f.dead.ID.String()+"/redrive", form()), "1 DLQ entries removed")
	if s := b.status(t, f.dead.ID); s != task.Queued {
		t.Fatalf("status %s", s)
	}
	if n := b.dlqLen(t); n != 0 {
		t.Fatalf("DLQ length %d after the redrive", n)
	}
	flash(c.post("/ui/tasks/"+f.queued.ID.String()+"/redrive", form()), "only DEAD and CANCELLED")

	// Replay of one DLQ entry.
	d2 := b.create(t, task.NewTask{Kind: "embed"})
	b.kill(t, d2.ID, "timeout")
	entries, _ := dlq.List(b.ctx, b.rdb, b.dlqKey, dlq.ListParams{})
	flash(c.post("/ui/dlq/replay", form("entry", entries[0].ID)), "replayed")
	if s := b.status(t, d2.ID); s != task.Queued {
		t.Fatalf("status %s", s)
	}

	// Bulk: a dry run changes nothing; the redrive redrives the matching
	// tasks only and removes their entries.
	var dead []uuid.UUID
	for i := range 3 {
		tk := b.create(t, task.NewTask{Kind: "embed"})
		b.kill(t, tk.ID, fmt.Sprintf("upstream 503 #%d", i))
		dead = append(dead, tk.ID)
	}
	other := b.create(t, task.NewTask{Kind: "embed"})
	b.kill(t, other.ID, "bad input")
	want(t, c.get("/ui/dlq?preview=1&kind=embed&error=upstream+503"), 200, "<strong>3</strong>")
	for _, id := range dead {
		if s := b.status(t, id); s != task.Dead {
			t.Fatalf("a dry run changed %s to %s", id, s)
		}
	}
	flash(c.post("/ui/dlq/redrive", form("status", "DEAD", "kind", "embed", "error", "upstream 503", "limit", "100")),
		"Matched 3 tasks, redrove 3, removed 3 DLQ entries.")
	for _, id := range dead {
		if s := b.status(t, id); s != task.Queued {
			t.Fatalf("%s is %s after the bulk redrive", id, s)
		}
	}
	if s := b.status(t, other.ID); s != task.Dead {
		t.Fatalf("a task outside the filter is %s", s)
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("DLQ length %d, want 1 (bad input)", n)
	}
	flash(c.post("/ui/dlq/redrive", form("status", "RUNNING")), "status must be")

	// Kinds: pause, resume, limits.
	kind := func() (paused bool, conc, rate int) {
		t.Helper()
		err := b.pool.QueryRow(b.ctx, `SELECT paused, concurrency, rate_count FROM ingest_kind WHERE kind = 'email'`).Scan(&paused, &conc, &rate)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	flash(c.post("/ui/kinds/email", form("op", "pause")), "Kind email paused")
	if p, _, _ := kind(); !p {
		t.Fatal("email not paused")
	}
	want(t, c.get("/ui/kinds"), 200, `id="resume-email"`)
	want(t, c.get("/ui/"), 200, "paused")
	flash(c.post("/ui/kinds/email", form("op", "resume")), "Kind email resumed")
	flash(c.post("/ui/kinds/email", form("op", "limits", "concurrency", "3", "rate", "5/s")), "limits set")
	if p, conc, rate := kind(); p || conc != 3 || rate != 5 {
		t.Fatalf("email paused %v concurrency %d rate %d", p, conc, rate)
	}
	perGroup, groupRate, window := 2, task.Rate{Count: 1, Per: time.Minute}, 40
	if _, err := b.store.SetKind(b.ctx, "test", "email", task.KindUpdate{ConcurrencyPerGroup: &perGroup, RatePerGroup: &groupRate, GroupWindow: &window}); err != nil {
		t.Fatal(err)
	}
	want(t, c.get("/ui/kinds?live=1"), 200, "per group: ≤2 running 1/m", "group window 40")
	flash(c.post("/ui/kinds/email", form("op", "limits", "concurrency", "0", "rate", "fast")), "Rate:")
	flash(c.post("/ui/kinds/email", form("op", "limits", "concurrency", "-1")), "concurrency must be a whole number from 0 to 100000")
	want(t, c.post("/ui/kinds/email", form("op", "explode")), 400)
	want(t, c.post("/ui/tasks/"+uuid.NewString()+"/cancel", form("confirm", "yes")), 404)
}

func TestOverviewCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	if _, err := b.store.Start(b.ctx, "w1", time.Minute, f.queued.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Succeed(b.ctx, "w1", f.queued.ID); err != nil {
		t.Fatal(err)
	}
	// The audit rows of the last minutes feed the charts and totals.
	c := b.client(t)
	testenv.Eventually(t, 10*time.Second, "the overview counts the success", func() bool {
		p := c.get("/ui/?live=1")
		return p.code == 200 && strings.Contains(p.body, "1 succeeded, 0 retried, 1 dead")
	})
	p := c.get("/ui/?live=1")
	// Each status with its exact count (delayed and queued are QUEUED).
	for _, s := range []string{`<span class="n">1</span>
    <span class="l">SUCCEEDED</span>`, `<span class="n">1</span>
    <span class="l">DEAD</span>`, `<span class="n">1</span>
    <span class="l">QUEUED</span>`} {
		want(t, p, 200, s)
	}
	// The retention windows the leader deletes finished tasks after.
	want(t, p, 200, "<dt>Retention</dt><dd>SUCCEEDED "+humantime.Duration(24*time.Hour)+", CANCELLED kept forever, DEAD "+humantime.Duration(168*time.Hour)+" after finishing</dd>")
}

// TestWithoutRedis: in Kafka mode there is no Redis to show; the pages
// still work from PostgreSQL, and a redrive has no DLQ stream to clean.
func TestWithoutRedis(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	h, err := ui.New(ui.Config{Store: b.store, DB: b.pool, DLQKey: "ignored without a client"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	b.srv = srv
	c := b.client(t)
	want(t, c.get("/ui/"), 200, "not used (Kafka mode)")
	want(t, c.get("/ui/tasks/"+f.dead.ID.String()), 200, "Not used (Kafka mode)", "upstream 503")
	want(t, c.get("/ui/dlq?preview=1"), 200, "No DLQ stream is configured", "<strong>1</strong>")
	csrf := c.csrf("/ui/kinds")
	want(t, c.post("/ui/tasks/"+f.dead.ID.String()+"/redrive", url.Values{"csrf": {csrf}}), 303)
	if s := b.status(t, f.dead.ID); s != task.Queued {
		t.Fatalf("status %s", s)
	}
}

// TestLiveRequestAfterLogout: a live refresh without a session tells
// htmx to go to the login page.
func TestLiveRequestAfterLogout(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: "tok"})
	c := b.client(t)
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/ui/?live=1", nil)
	req.Header.Set("HX-Request", "true")
	p := c.do(req)
	if p.code != http.StatusUnauthorized || p.header.Get("HX-Redirect") != "/ui/login" {
		t.Fatalf("live request without a session: %d, HX-Redirect %q", p.code, p.header.Get("HX-Redirect"))
	}
}

// TestParkedTasks: a parked task's page and its row in the list say why it
// waits, parked for a paused kind or waiting for a slot under a limit,
// and show no far-future time.
func TestParkedTasks(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	paused := b.create(t, task.NewTask{Kind: "p"})
	if _, err := b.store.SetPaused(b.ctx, "test", "p", true); err != nil {
		t.Fatal(err)
	}
	if parked, err := b.store.Park(b.ctx, paused.ID); err != nil || len(parked) != 1 {
		t.Fatalf("Park = %v, %v", parked, err)
	}
	one := 1
	if _, err := b.store.SetKind(b.ctx, "test", "l", task.KindUpdate{Concurrency: &one}); err != nil {
		t.Fatal(err)
	}
	running, waiting := b.create(t, task.NewTask{Kind: "l"}), b.create(t, task.NewTask{Kind: "l"})
	rs, err := b.store.StartLimited(b.ctx, "w1", time.Minute, "l", running.ID, waiting.ID)
	if err != nil || rs[0].Outcome != task.Started || rs[1].Outcome != task.ParkedAtLimit {
		t.Fatalf("StartLimited = %+v, %v; want the first started, the second parked", rs, err)
	}
	c := b.client(t)
	for path, says := range map[string]string{
		"/ui/tasks/" + paused.ID.String():  `id="parked">parked (kind paused)</span>`,
		"/ui/tasks?kind=p":                 "parked (kind paused)",
		"/ui/tasks/" + waiting.ID.String(): `id="parked">waiting for a slot</span>`,
		"/ui/tasks?kind=l":                 "waiting for a slot",
	} {
		p := c.get(path)
		want(t, p, 200, says)
		for _, bad := range []string{"9999", "106751d"} {
			if strings.Contains(p.body, bad) {
				t.Fatalf("a page of parked tasks shows %q:\n%s", bad, clip(p.body))
			}
		}
	}
	if p := c.get("/ui/tasks/" + running.ID.String()); strings.Contains(p.body, `id="parked"`) {
		t.Fatal("the running task's page says it is parked")
	}
}

// TestRedriveActsOnTheDryRun: the button under a dry run redrives the
// tasks the dry run listed, and none that died after it.
func TestRedriveActsOnTheDryRun(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	c := b.client(t)
	var listed []uuid.UUID
	for range 3 {
		tk := b.create(t, task.NewTask{Kind: "preview", Payload: json.RawMessage(`{}`)})
		b.kill(t, tk.ID, "upstream 503")
		listed = append(listed, tk.ID)
	}
	p := c.get("/ui/dlq?preview=1&kind=preview")
	want(t, p, 200, "<strong>3</strong>", "Redrive these 3 tasks")
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`).FindAllStringSubmatch(p.body, -1) {
		form.Set(m[1], m[2])
	}
	if form.Get("csrf") == "" || form.Get("kind") != "preview" {
		t.Fatalf("the dry run's redrive form: %v", form)
	}
	// Two more tasks of the filter die after the dry run.
	var later []uuid.UUID
	for range 2 {
		tk := b.create(t, task.NewTask{Kind: "preview", Payload: json.RawMessage(`{}`)})
		b.kill(t, tk.ID, "upstream 503")
		later = append(later, tk.ID)
	}
	want(t, c.post("/ui/dlq/redrive", form), http.StatusSeeOther)
	for _, id := range listed {
		if s := b.status(t, id); s != task.Queued {
			t.Errorf("task %s of the dry run is %s, want QUEUED", id, s)
		}
	}
	for _, id := range later {
		if s := b.status(t, id); s != task.Dead {
			t.Errorf("task %s died after the dry run and is %s, want DEAD (not redriven)", id, s)
		}
	}
	if n := b.dlqLen(t); n != 2 {
		t.Fatalf("DLQ depth %d after the redrive, want the 2 entries of the tasks that died later", n)
	}
	// A single task's button says so.
	want(t, c.get("/ui/dlq?preview=1&kind=preview&limit=1"), 200, "Redrive this task")
}

// TestRoughEdges: a failed task's page shows its error once, under one
// name; a kind that is not paused is "active" as in the CLI; counts take
// the noun of their number.
func TestRoughEdges(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	dead := b.create(t, task.NewTask{Kind: "edge"})
	b.kill(t, dead.ID, "upstream said no")
	c := b.client(t)
	p := c.get("/ui/tasks/" + dead.ID.String())
	want(t, p, 200, `id="last-error">upstream said no</pre>`)
	if strings.Contains(p.body, "Error message") || strings.Count(p.body, `<pre class="err"`) != 1 {
		t.Fatalf("the task's error is shown more than once:\n%s", clip(p.body))
	}
	p = c.get("/ui/kinds")
	want(t, p, 200, `<span class="badge ok">active</span>`)
	if strings.Contains(p.body, `badge ok">running`) {
		t.Fatal("the kinds page calls a kind that is not paused running")
	}
	later := b.create(t, task.NewTask{Kind: "edge", Delay: time.Hour})
	p = c.get("/ui/tasks/" + later.ID.String())
	want(t, p, 200, "<dt>Next run</dt>")
	if strings.Contains(p.body, "Next retry") {
		t.Fatal("a delayed task that never ran shows a next retry")
	}
	want(t, c.get("/ui/dlq"), 200, ": 1 entry</h2>")
	want(t, c.get("/ui/dlq?preview=1&kind=edge"), 200, "dead task matches")
}
