package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// unreachableStore returns a task store on a pool whose PostgreSQL cannot
// be reached (a closed port, with the user leakuser, password leakpw and
// database leakdb, which no answer may show), the pool and the port.
func unreachableStore(t *testing.T) (*task.Store, *pgxpool.Pool, string) {
	t.Helper()
	pool, port := testenv.UnreachablePool(t)
	store, err := task.NewStore(task.Config{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	return store, pool, port
}

// wantUnavailable checks a 503 with Retry-After whose body shows none of
// secrets.
func wantUnavailable(t *testing.T, what string, r response, secrets ...string) {
	t.Helper()
	if r.code != http.StatusServiceUnavailable {
		t.Fatalf("%s: %d %s, want 503", what, r.code, r.body)
	}
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("%s: Retry-After %q, want whole seconds", what, r.header.Get("Retry-After"))
	}
	msg, _ := r.errorBody(t)
	if !strings.Contains(msg, "unavailable") {
		t.Fatalf("%s: error %q does not say the database is unavailable", what, msg)
	}
	for _, s := range secrets {
		if strings.Contains(string(r.body), s) {
			t.Fatalf("%s: the body shows %q: %s", what, s, r.body)
		}
	}
}

// TestDatabaseUnavailable: with PostgreSQL unreachable every route that
// needs it answers 503 with Retry-After, so that a client knows to retry,
// and shows neither the connection's user, database, host nor port.
func TestDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	store, _, port := unreachableStore(t)
	h, err := api.New(api.Config{}, store, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{srv: httptest.NewServer(h), store: store}
	t.Cleanup(b.srv.Close)
	id := uuid.NewString()
	for _, rt := range [][3]string{
		{"POST", "/v1/tasks", `{"kind":"k","payload":{}}`},
		{"POST", "/v1/tasks:batch", `[{"kind":"k","payload":{}}]`},
		{"GET", "/v1/tasks", ""},
		{"GET", "/v1/tasks/" + id, ""},
		{"POST", "/v1/tasks/" + id + "/redrive", ""},
		{"POST", "/v1/tasks/" + id + "/cancel", ""},
		{"POST", "/v1/tasks/redrive", `{"status":"DEAD"}`},
		{"GET", "/v1/kinds", ""},
		{"PUT", "/v1/kinds/k", `{"paused":true}`},
	} {
		wantUnavailable(t, rt[0]+" "+rt[1], b.do(t, rt[0], rt[1], rt[2]), "leakuser", "leakpw", "leakdb", "127.0.0.1", port)
	}

	// A pool closed under the server (the process shutting down).
	db := testenv.NewDatabase(t)
	closed, err := pgxpool.New(t.Context(), db.URL)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	store, _ = task.NewStore(task.Config{}, closed)
	h, _ = api.New(api.Config{}, store, nil, nil)
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	wantUnavailable(t, "closed pool", b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":{}}`))
}

// TestRedisUnavailable: a bulk redrive whose DLQ cleanup cannot reach Redis
// answers 503 with Retry-After, without Redis's address.
func TestRedisUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	r, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Start(ctx, "w", time.Minute, r.Task.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Fail(ctx, "w", task.Failure{ID: r.Task.ID, Error: "boom", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	port := testenv.ClosedPort(t)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	h, err := api.New(api.Config{DLQClient: rdb, DLQKey: "dlq"}, b.store, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	wantUnavailable(t, "bulk redrive", b.do(t, "POST", "/v1/tasks/redrive", `{"status":"DEAD"}`), "127.0.0.1", port)
}
