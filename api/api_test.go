package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type bundle struct {
	srv   *httptest.Server
	store *task.Store
	db    *testenv.Database
	token string
	rdb   *redis.Client // with options.dlq
	dlq   string
}

type options struct {
	token      string
	maxPayload int
	checks     api.Checks
	gatherer   prometheus.Gatherer
	periodic   func(time.Time) []maintenance.Slot
	dlq        bool // a real Redis and a DLQ key for bulk redrive
	registerer prometheus.Registerer
	keyring    *seal.Keyring // encryption at rest
}

func setup(t *testing.T, o options) *bundle {
	t.Helper()
	db := testenv.NewDatabase(t)
	store, err := task.NewStore(task.Config{MaxPayloadBytes: o.maxPayload, Keyring: o.keyring}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{store: store, token: o.token, db: db}
	cfg := api.Config{Token: o.token, Periodic: o.periodic, Registerer: o.registerer}
	if o.dlq {
		b.rdb = testenv.Client(t, testenv.RedisURL(t))
		_, b.dlq = testenv.Keys(t)
		cfg.DLQClient, cfg.DLQKey = b.rdb, b.dlq
	}
	h, err := api.New(cfg, store, o.checks, o.gatherer)
	if err != nil {
		t.Fatal(err)
	}
	b.srv = httptest.NewServer(h)
	t.Cleanup(b.srv.Close)
	return b
}

type response struct {
	code   int
	header http.Header
	body   []byte
}

func (r response) errorBody(t *testing.T) (msg, field string) {
	t.Helper()
	var e struct {
		Error string `json:"error"`
		Field string `json:"field"`
	}
	if err := json.Unmarshal(r.body, &e); err != nil || e.Error == "" {
		t.Fatalf("body %q is not a JSON error: %v", r.body, err)
	}
	return e.Error, e.Field
}

func (b *bundle) do(t *testing.T, method, path, body string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if b.token != "" {
		req.Header.Set("Authorization", "Bearer "+b.token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, data}
}

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
	return v
}

func TestCreate(t *testing.T) {
	t.Parallel()

	t.Run("CreatedThenIdempotent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{})
		body := `{"kind":"email","payload":{"to":"a@example.com"},"idempotency_key":"order-1","max_attempts":3}`
		r := b.do(t, "POST", "/v1/tasks", body)
		if r.code != http.StatusCreated {
			t.Fatalf("first create: %d %s", r.code, r.body)
		}
		created := decode[api.CreateResponse](t, r)
		if created.ID == uuid.Nil || created.Status != task.Queued {
			t.Fatalf("created = %+v", created)
		}
		r = b.do(t, "POST", "/v1/tasks", body)
		if r.code != http.StatusOK {
			t.Fatalf("repeat: %d %s, want 200", r.code, r.body)
		}
		again := decode[task.Task](t, r)
		if again.ID != created.ID || again.MaxAttempts == nil || *again.MaxAttempts != 3 || again.IdempotencyKey != "order-1" {
			t.Fatalf("repeat returned %+v, want task %s", again, created.ID)
		}
		got, err := b.store.Get(context.Background(), created.ID)
		if canon, _ := task.Canonical(got.Payload); err != nil || got.Kind != "email" || string(canon) != `{"to":"a@example.com"}` {
			t.Fatalf("stored task %+v, %v", got, err)
		}
	})

	t.Run("Scheduled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{})
		runAt := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
		for _, tc := range []struct{ body, what string }{
			{`{"kind":"k","payload":1,"run_at":"` + runAt.Format(time.RFC3339Nano) + `","timeout_ms":2500}`, "run_at"},
			{`{"kind":"k","payload":2,"delay_ms":60000}`, "delay_ms"},
		} {
			r := b.do(t, "POST", "/v1/tasks", tc.body)
			if r.code != http.StatusCreated {
				t.Fatalf("%s: %d %s", tc.what, r.code, r.body)
			}
			got, err := b.store.Get(context.Background(), decode[api.CreateResponse](t, r).ID)
			if err != nil || got.Status != task.Queued || got.NextRetryAt == nil {
				t.Fatalf("%s: stored %+v, %v; want QUEUED with a next_retry_at", tc.what, got, err)
			}
			switch tc.what {
			case "run_at":
				if !got.NextRetryAt.Equal(runAt) || got.TimeoutMS != 2500 {
					t.Fatalf("run_at: next_retry_at %v timeout_ms %d, want %v and 2500", got.NextRetryAt, got.TimeoutMS, runAt)
				}
			case "delay_ms":
				if d := got.NextRetryAt.Sub(got.CreatedAt); d != time.Minute {
					t.Fatalf("delay_ms: due %s after creation, want 1m", d)
				}
			}
		}
	})

	t.Run("Priority", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{})
		for _, tc := range []struct {
			body string
			want int
		}{
			{`{"kind":"k","payload":1,"priority":1}`, 1},
			{`{"kind":"k","payload":2,"priority":4}`, 4},
			{`{"kind":"k","payload":3,"priority":2}`, 2},
			{`{"kind":"k","payload":4}`, 2},
		} {
			r := b.do(t, "POST", "/v1/tasks", tc.body)
			if r.code != http.StatusCreated {
				t.Fatalf("%s: %d %s", tc.body, r.code, r.body)
			}
			id := decode[api.CreateResponse](t, r).ID
			got, err := b.store.Get(context.Background(), id)
			if err != nil || got.Priority != tc.want {
				t.Fatalf("%s: stored priority %d, %v; want %d", tc.body, got.Priority, err, tc.want)
			}
			var stored *int
			if err := b.db.Pool.QueryRow(context.Background(), `SELECT priority FROM ingest_task WHERE id = $1`, id).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if (tc.want == 2) != (stored == nil) {
				t.Fatalf("%s: priority column %v; want NULL exactly for the default", tc.body, stored)
			}
			r = b.do(t, "GET", "/v1/tasks/"+id.String(), "")
			if shown := decode[task.Task](t, r); shown.Priority != tc.want {
				t.Fatalf("%s: GET shows priority %d, want %d", tc.body, shown.Priority, tc.want)
			}
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{})
		tests := []struct {
			name, body, field, msg string
		}{
			{"MalformedJSON", `{"kind": "x", `, "", "malformed JSON"},
			{"SyntaxError", `{"kind": x}`, "", "malformed JSON"},
			{"Empty", ``, "", "empty"},
			{"NotAnObject", `[1,2]`, "", "must be a JSON object"},
			{"TwoValues", `{"kind":"k","payload":1} {}`, "", "more than one value"},
			{"MissingKind", `{"payload":{}}`, "kind", "kind is required"},
			{"BlankKind", `{"kind":"  ","payload":{}}`, "kind", "kind is required"},
			{"LongKind", `{"kind":"` + strings.Repeat("k", 201) + `","payload":{}}`, "kind", "longer than"},
			{"KindNotString", `{"kind":7,"payload":{}}`, "kind", "must be a JSON string"},
			{"MissingPayload", `{"kind":"k"}`, "payload", "payload is required"},
			{"NullPayload", `{"kind":"k","payload":null}`, "payload", "payload is required"},
			{"NULInPayload", `{"kind":"k","payload":"a\u0000b"}`, "payload", "\\u0000"},
			{"ZeroMaxAttempts", `{"kind":"k","payload":1,"max_attempts":0}`, "max_attempts", "from 1 to 1000000"},
			{"MaxAttemptsNotInt", `{"kind":"k","payload":1,"max_attempts":"3"}`, "max_attempts", "must be a whole number"},
			{"UnknownField", `{"kind":"k","payload":1,"urgency":5}`, "urgency", "unknown field"},
			{"PriorityTooHigh", `{"kind":"k","payload":1,"priority":0}`, "priority", "from 1 to 4"},
			{"PriorityTooLow", `{"kind":"k","payload":1,"priority":5}`, "priority", "from 1 to 4"},
			{"PriorityNotInt", `{"kind":"k","payload":1,"priority":"high"}`, "priority", "must be a whole number from 1 to 4, got string"},
			{"PriorityFraction", `{"kind":"k","payload":1,"priority":1.5}`, "priority", "must be a whole number from 1 to 4, got number 1.5"},
			{"LongIdempotencyKey", `{"kind":"k","payload":1,"idempotency_key":"` + strings.Repeat("i", 1001) + `"}`, "idempotency_key", "longer than"},
			{"LongGroupKey", `{"kind":"k","payload":1,"group_key":"` + strings.Repeat("g", 201) + `"}`, "group_key", "longer than"},
			{"GroupKeyControl", `{"kind":"k","payload":1,"group_key":"a\u0007"}`, "group_key", "control"},
			{"GroupKeyNotString", `{"kind":"k","payload":1,"group_key":7}`, "group_key", "must be a JSON string"},
			{"RunAtNotRFC3339", `{"kind":"k","payload":1,"run_at":"tomorrow"}`, "run_at", "RFC 3339"},
			{"RunAtAndDelay", `{"kind":"k","payload":1,"run_at":"2030-01-01T00:00:00Z","delay_ms":5}`, "run_at", "exclusive"},
			{"NegativeDelay", `{"kind":"k","payload":1,"delay_ms":-5}`, "delay_ms", "from 0 to"},
			{"HugeDelay", `{"kind":"k","payload":1,"delay_ms":9223372036854775807}`, "delay_ms", "from 0 to 315619200000"},
			{"NegativeTimeout", `{"kind":"k","payload":1,"timeout_ms":-1}`, "timeout_ms", "from 0 to"},
			{"TimeoutNotInt", `{"kind":"k","payload":1,"timeout_ms":1.5}`, "timeout_ms", "must be a whole number from 0 to 2147483647, got number 1.5"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				r := b.do(t, "POST", "/v1/tasks", tt.body)
				if r.code != http.StatusBadRequest {
					t.Fatalf("%d %s, want 400", r.code, r.body)
				}
				msg, field := r.errorBody(t)
				if field != tt.field || !strings.Contains(msg, tt.msg) {
					t.Fatalf("error %q field %q, want field %q and %q in the message", msg, field, tt.field, tt.msg)
				}
			})
		}
		tasks, _, err := b.store.List(context.Background(), task.ListParams{})
		if err != nil || len(tasks) != 0 {
			t.Fatalf("bad requests created %d tasks (%v)", len(tasks), err)
		}
	})

	t.Run("TooLarge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, options{maxPayload: 1024})
		big := `"` + strings.Repeat("x", 1100) + `"`
		r := b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":`+big+`}`)
		if r.code != http.StatusRequestEntityTooLarge {
			t.Fatalf("payload over the limit: %d %s, want 413", r.code, r.body)
		}
		if _, field := r.errorBody(t); field != "payload" {
			t.Fatalf("field = %q, want payload", field)
		}
		huge := `{"kind":"k","payload":"` + strings.Repeat("x", 1024+api.DefaultEnvelopeBytes) + `"}`
		r = b.do(t, "POST", "/v1/tasks", huge)
		if r.code != http.StatusRequestEntityTooLarge {
			t.Fatalf("body over the limit: %d %s, want 413", r.code, r.body)
		}
		r = b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":`+`"`+strings.Repeat("x", 1000)+`"}`)
		if r.code != http.StatusCreated {
			t.Fatalf("payload under the limit: %d %s", r.code, r.body)
		}
	})
}

func TestBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "POST", "/v1/tasks:batch", `[{"kind":"a","payload":1},{"kind":"b","payload":{"x":2},"idempotency_key":"k1"},{"kind":"b","payload":3,"idempotency_key":"k1"}]`)
	if r.code != http.StatusCreated {
		t.Fatalf("%d %s", r.code, r.body)
	}
	res := decode[api.BatchResponse](t, r)
	if len(res.Tasks) != 3 || res.Tasks[1].ID != res.Tasks[2].ID || !res.Tasks[2].Existing || res.Tasks[0].Existing {
		t.Fatalf("batch result %+v", res)
	}

	// One bad element: 400 naming it, nothing created.
	r = b.do(t, "POST", "/v1/tasks:batch", `[{"kind":"c","payload":1},{"payload":2}]`)
	if r.code != http.StatusBadRequest {
		t.Fatalf("%d %s", r.code, r.body)
	}
	if _, field := r.errorBody(t); field != "[1].kind" {
		t.Fatalf("field = %q, want [1].kind", field)
	}
	r = b.do(t, "POST", "/v1/tasks:batch", `[{"kind":"c","payload":1},{"kind":"c","payload":2,"extra":1}]`)
	if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "[1].extra" {
		t.Fatalf("%d field %q, want 400 [1].extra", r.code, field)
	}
	for _, body := range []string{`[]`, `{"kind":"a","payload":1}`} {
		if r := b.do(t, "POST", "/v1/tasks:batch", body); r.code != http.StatusBadRequest {
			t.Fatalf("batch %s: %d %s, want 400", body, r.code, r.body)
		}
	}
	tasks, _, err := b.store.List(context.Background(), task.ListParams{Kind: "c"})
	if err != nil || len(tasks) != 0 {
		t.Fatalf("failed batches created %d tasks (%v)", len(tasks), err)
	}
}

func TestGetListRedrive(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	var ids []uuid.UUID
	for i := range 5 {
		c, err := b.store.Create(ctx, task.NewTask{Kind: fmt.Sprintf("k%d", i%2), Payload: json.RawMessage(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.Task.ID)
	}

	t.Run("Get", func(t *testing.T) {
		r := b.do(t, "GET", "/v1/tasks/"+ids[0].String(), "")
		if r.code != http.StatusOK {
			t.Fatalf("%d %s", r.code, r.body)
		}
		got := decode[api.TaskResponse](t, r)
		if got.ID != ids[0] || string(got.Payload) != "0" || len(got.Transitions) != 1 || got.Transitions[0].To != "QUEUED" {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("GetUnknown", func(t *testing.T) {
		r := b.do(t, "GET", "/v1/tasks/"+uuid.NewString(), "")
		if _, field := r.errorBody(t); r.code != http.StatusNotFound || field != "id" {
			t.Fatalf("%d field %q, want 404 id", r.code, field)
		}
	})
	t.Run("BadUUID", func(t *testing.T) {
		for _, path := range []string{"/v1/tasks/not-a-uuid", "/v1/tasks/123/redrive"} {
			method := "GET"
			if strings.HasSuffix(path, "redrive") {
				method = "POST"
			}
			r := b.do(t, method, path, "")
			if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "id" {
				t.Fatalf("%s %s: %d field %q, want 400 id", method, path, r.code, field)
			}
		}
	})
	t.Run("ListPages", func(t *testing.T) {
		var seen []uuid.UUID
		cursor := ""
		for page := 0; ; page++ {
			r := b.do(t, "GET", "/v1/tasks?limit=2&cursor="+cursor, "")
			if r.code != http.StatusOK {
				t.Fatalf("%d %s", r.code, r.body)
			}
			l := decode[api.ListResponse](t, r)
			for _, tk := range l.Tasks {
				seen = append(seen, tk.ID)
			}
			if l.NextCursor == "" {
				break
			}
			cursor = l.NextCursor
			if page > 5 {
				t.Fatal("too many pages")
			}
		}
		if len(seen) != 5 || seen[0] != ids[4] || seen[4] != ids[0] {
			t.Fatalf("listing %v, want %v newest first", seen, ids)
		}
	})
	t.Run("ListFilters", func(t *testing.T) {
		r := b.do(t, "GET", "/v1/tasks?kind=k1&status=queued", "")
		l := decode[api.ListResponse](t, r)
		if r.code != http.StatusOK || len(l.Tasks) != 2 {
			t.Fatalf("%d %+v", r.code, l)
		}
		r = b.do(t, "GET", "/v1/tasks?status=SUCCEEDED", "")
		if l := decode[api.ListResponse](t, r); l.Tasks == nil || len(l.Tasks) != 0 {
			t.Fatalf("empty listing %s, want []", r.body)
		}
	})
	t.Run("ListBadQuery", func(t *testing.T) {
		for q, want := range map[string]string{"status=DONE": "status", "limit=0": "limit", "limit=x": "limit", "limit=1001": "limit", "cursor=zzz": "cursor", "sort=asc": "sort"} {
			r := b.do(t, "GET", "/v1/tasks?"+q, "")
			if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != want {
				t.Errorf("?%s: %d field %q, want 400 %s", q, r.code, field, want)
			}
		}
	})
	t.Run("Redrive", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/tasks/"+ids[1].String()+"/redrive", "")
		if r.code != http.StatusConflict {
			t.Fatalf("redrive of a QUEUED task: %d %s, want 409", r.code, r.body)
		}
		r = b.do(t, "POST", "/v1/tasks/"+uuid.NewString()+"/redrive", "")
		if r.code != http.StatusNotFound {
			t.Fatalf("redrive of an unknown task: %d %s, want 404", r.code, r.body)
		}
		if _, err := b.store.Start(ctx, "w", time.Minute, ids[1]); err != nil {
			t.Fatal(err)
		}
		if res, err := b.store.Fail(ctx, "w", task.Failure{ID: ids[1], Error: "bad", Permanent: true}); err != nil || res[0].Status != task.Dead {
			t.Fatalf("fail: %+v %v", res, err)
		}
		r = b.do(t, "POST", "/v1/tasks/"+ids[1].String()+"/redrive", "")
		if got := decode[api.RedriveResponse](t, r); r.code != http.StatusOK || got.Status != task.Queued {
			t.Fatalf("redrive: %d %s", r.code, r.body)
		}
	})
}

func TestAuth(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, options{token: "s3cret-token", gatherer: reg})
	for _, tt := range []struct {
		name, header string
		want         int
	}{
		{"Missing", "", http.StatusUnauthorized},
		{"Wrong", "Bearer nope", http.StatusUnauthorized},
		{"WrongScheme", "Basic s3cret-token", http.StatusUnauthorized},
		{"Prefix", "Bearer s3cret", http.StatusUnauthorized},
		{"Right", "Bearer s3cret-token", http.StatusOK},
		{"SchemeCaseInsensitive", "bearer s3cret-token", http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", b.srv.URL+"/v1/tasks", nil)
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("%d %s, want %d", resp.StatusCode, body, tt.want)
			}
			if tt.want == http.StatusUnauthorized {
				if resp.Header.Get("WWW-Authenticate") == "" || bytes.Contains(body, []byte("s3cret")) {
					t.Fatalf("401 without WWW-Authenticate or echoing the token: %s", body)
				}
			}
		})
	}
	t.Run("ProbesAndMetricsOpen", func(t *testing.T) {
		for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
			resp, err := http.Get(b.srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d without a token, want 200", path, resp.StatusCode)
			}
		}
	})
	t.Run("EveryTaskRouteProtected", func(t *testing.T) {
		id := uuid.NewString()
		for _, rt := range [][2]string{{"POST", "/v1/tasks"}, {"POST", "/v1/tasks:batch"}, {"GET", "/v1/tasks"}, {"GET", "/v1/tasks/" + id}, {"POST", "/v1/tasks/" + id + "/redrive"}} {
			req, _ := http.NewRequest(rt[0], b.srv.URL+rt[1], strings.NewReader(`{}`))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("%s %s without a token: %d, want 401", rt[0], rt[1], resp.StatusCode)
			}
		}
	})
}

func TestProbesAndMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "ingest_task_dlq_total", Help: "x"})
	reg.MustRegister(c)
	c.Add(3)
	// What go-redis returns when nothing listens: its address must not
	// reach the probe's answer.
	_, redisDown := net.Dial("tcp", "127.0.0.1:"+testenv.ClosedPort(t))
	if redisDown == nil {
		t.Fatal("dialled a closed port")
	}
	schemaOld := errors.New("schema outdated (database at version 11, this build needs 12): run `ingest-worker migrate`")
	var failing atomic.Bool
	b := setup(t, options{gatherer: reg, checks: api.Checks{
		"postgres": func(context.Context) error { return nil },
		"redis": func(context.Context) error {
			if failing.Load() {
				return redisDown
			}
			return nil
		},
		"schema": func(context.Context) error {
			if failing.Load() {
				return schemaOld
			}
			return nil
		},
	}})

	r := b.do(t, "GET", "/healthz", "")
	if r.code != http.StatusOK {
		t.Fatalf("healthz %d", r.code)
	}
	r = b.do(t, "GET", "/readyz", "")
	if r.code != http.StatusOK || !strings.Contains(string(r.body), `"redis":"ok"`) {
		t.Fatalf("readyz %d %s", r.code, r.body)
	}
	failing.Store(true)
	r = b.do(t, "GET", "/readyz", "")
	if r.code != http.StatusServiceUnavailable || !strings.Contains(string(r.body), `"redis":"unavailable`) || !strings.Contains(string(r.body), `"postgres":"ok"`) ||
		strings.Contains(string(r.body), "127.0.0.1") || !strings.Contains(string(r.body), "run `ingest-worker migrate`") {
		t.Fatalf("readyz with redis down and an old schema: %d %s", r.code, r.body)
	}
	r = b.do(t, "GET", "/metrics", "")
	if r.code != http.StatusOK || !strings.Contains(string(r.body), "ingest_task_dlq_total 3") {
		t.Fatalf("metrics %d %s", r.code, r.body)
	}
	if r := b.do(t, "DELETE", "/v1/tasks", ""); r.code != http.StatusMethodNotAllowed {
		t.Fatalf("DELETE /v1/tasks: %d, want 405", r.code)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	create := func() uuid.UUID {
		res, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		return res.Task.ID
	}
	lastAudit := func(id uuid.UUID) (from, to, worker, msg string) {
		_, recs, err := b.store.GetWithTransitions(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		r := recs[len(recs)-1]
		return r.From, r.To, r.Worker, r.Message
	}
	t.Run("Queued", func(t *testing.T) {
		id := create()
		r := b.do(t, "POST", "/v1/tasks/"+id.String()+"/cancel", `{"reason": "not needed"}`)
		got := decode[task.Task](t, r)
		if r.code != http.StatusOK || got.Status != task.Cancelled || got.CancelReason != "not needed" || got.CancelRequestedBy != api.DefaultActor {
			t.Fatalf("cancel of a QUEUED task: %d %s", r.code, r.body)
		}
		if from, to, worker, msg := lastAudit(id); from != "QUEUED" || to != "CANCELLED" || worker != api.DefaultActor || msg != "cancelled: not needed" {
			t.Fatalf("audit %s -> %s by %q: %q", from, to, worker, msg)
		}
		// Terminal now: 409, and redrive brings it back.
		r = b.do(t, "POST", "/v1/tasks/"+id.String()+"/cancel", "")
		if msg, field := r.errorBody(t); r.code != http.StatusConflict || field != "id" || !strings.Contains(msg, "CANCELLED") {
			t.Fatalf("cancel of a CANCELLED task: %d %s, want 409", r.code, r.body)
		}
		r = b.do(t, "POST", "/v1/tasks/"+id.String()+"/redrive", "")
		if got := decode[api.RedriveResponse](t, r); r.code != http.StatusOK || got.Status != task.Queued {
			t.Fatalf("redrive of a CANCELLED task: %d %s", r.code, r.body)
		}
	})
	t.Run("RunningNoBody", func(t *testing.T) {
		id := create()
		if _, err := b.store.Start(ctx, "w", time.Minute, id); err != nil {
			t.Fatal(err)
		}
		r := b.do(t, "POST", "/v1/tasks/"+id.String()+"/cancel", "")
		got := decode[task.Task](t, r)
		if r.code != http.StatusAccepted || got.Status != task.Running || got.CancelRequestedAt == nil {
			t.Fatalf("cancel of a RUNNING task: %d %s, want 202 with the cancel requested", r.code, r.body)
		}
		if res, err := b.store.Succeed(ctx, "w", id); err != nil || res[0].Status != task.Cancelled {
			t.Fatalf("completion after the cancel request: %+v %v", res, err)
		}
		if from, to, worker, msg := lastAudit(id); from != "RUNNING" || to != "CANCELLED" || worker != api.DefaultActor || msg != "cancelled" {
			t.Fatalf("audit %s -> %s by %q: %q", from, to, worker, msg)
		}
	})
	t.Run("Errors", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/tasks/"+uuid.NewString()+"/cancel", "")
		if r.code != http.StatusNotFound {
			t.Fatalf("cancel of an unknown task: %d %s, want 404", r.code, r.body)
		}
		r = b.do(t, "POST", "/v1/tasks/nope/cancel", "")
		if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "id" {
			t.Fatalf("cancel with a bad id: %d %s", r.code, r.body)
		}
		id := create()
		for body, field := range map[string]string{`{"reason": 1}`: "reason", `{"why": "x"}`: "why", `{"reason": "` + strings.Repeat("x", task.MaxCancelReasonBytes+1) + `"}`: "reason"} {
			r = b.do(t, "POST", "/v1/tasks/"+id.String()+"/cancel", body)
			if _, f := r.errorBody(t); r.code != http.StatusBadRequest || f != field {
				t.Errorf("body %.40s: %d field %q, want 400 %s", body, r.code, f, field)
			}
		}
		succeeded := create()
		if _, err := b.store.Start(ctx, "w", time.Minute, succeeded); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Succeed(ctx, "w", succeeded); err != nil {
			t.Fatal(err)
		}
		r = b.do(t, "POST", "/v1/tasks/"+succeeded.String()+"/cancel", `{"reason": "late"}`)
		if msg, _ := r.errorBody(t); r.code != http.StatusConflict || !strings.Contains(msg, "SUCCEEDED") {
			t.Fatalf("cancel of a SUCCEEDED task: %d %s, want 409", r.code, r.body)
		}
	})
}

// TestPeriodic: GET /v1/periodic answers the next slot of every schedule,
// an empty list without any, and needs the token like the task API.
func TestPeriodic(t *testing.T) {
	t.Parallel()
	schedules, err := maintenance.ParseSchedules("INGEST_PERIODIC", []byte(`[{"kind":"sync","every":"30s"},{"kind":"report","cron":"0 3 * * *"}]`))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{token: "tok", periodic: func(now time.Time) []maintenance.Slot { return maintenance.NextSlots(schedules, now) }})
	if r := b.do(t, "GET", "/v1/periodic", "", "Authorization", ""); r.code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d, want 401", r.code)
	}
	r := b.do(t, "GET", "/v1/periodic", "")
	got := decode[api.PeriodicResponse](t, r)
	if r.code != http.StatusOK || len(got.Schedules) != 2 || got.Schedules[0].Kind != "sync" ||
		got.Schedules[0].At.Unix()%30 != 0 || !got.Schedules[0].At.After(time.Now().Add(-time.Second)) ||
		got.Schedules[1].At.UTC().Hour() != 3 || got.Schedules[0].IdempotencyKey == "" {
		t.Fatalf("GET /v1/periodic = %d %+v", r.code, got)
	}
	none := setup(t, options{})
	if r := none.do(t, "GET", "/v1/periodic", ""); r.code != http.StatusOK || strings.TrimSpace(string(r.body)) != `{"schedules":[]}` {
		t.Fatalf("no schedules: %d %s", r.code, r.body)
	}
}

// TestListScheduled: ?status=scheduled lists the QUEUED and RETRYING tasks
// due later (delayed ones here), not those due now, in any case.
func TestListScheduled(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	later, err := b.store.Create(ctx, task.NewTask{Kind: "s", Payload: json.RawMessage(`1`), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Create(ctx, task.NewTask{Kind: "s", Payload: json.RawMessage(`2`)}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"status=scheduled", "status=SCHEDULED&kind=s"} {
		r := b.do(t, "GET", "/v1/tasks?"+q, "")
		l := decode[api.ListResponse](t, r)
		if r.code != http.StatusOK || len(l.Tasks) != 1 || l.Tasks[0].ID != later.Task.ID {
			t.Fatalf("?%s: %d %s, want the delayed task only", q, r.code, r.body)
		}
	}
	r := b.do(t, "GET", "/v1/tasks?status=later", "")
	if msg, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "status" || !strings.Contains(msg, "scheduled") {
		t.Fatalf("?status=later: %d %q field %q, want 400 naming status and the scheduled filter", r.code, msg, field)
	}
}
