package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/webhook"
)

// recorder is a webhook receiver answering with a scripted response and
// keeping the requests it saw.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

type seen struct {
	method, key, contentType string
	body                     webhook.Request
}

func (r *recorder) serve(t *testing.T, respond func(w http.ResponseWriter, req *http.Request)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var body webhook.Request
		if err := json.Unmarshal(b, &body); err != nil {
			t.Errorf("request body %q: %v", b, err)
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, seen{req.Method, req.Header.Get("Idempotency-Key"), req.Header.Get("Content-Type"), body})
		r.mu.Unlock()
		respond(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func newHandler(t *testing.T, cfg webhook.Config) ingest.Handler {
	t.Helper()
	h, err := webhook.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func testTask() ingest.Task {
	return ingest.Task{ID: uuid.New(), Kind: "send", Payload: json.RawMessage(`{"to":"a@example.com"}`), Attempt: 2, MaxAttempts: 5}
}

func status(code int, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte("answer body"))
	}
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		name      string
		respond   func(http.ResponseWriter, *http.Request)
		ok        bool
		permanent bool
		delay     time.Duration // expected Retry-After delay, 0: none
		slack     time.Duration
	}{
		{name: "OK200", respond: status(200), ok: true},
		{name: "Accepted202", respond: status(202), ok: true},
		{name: "NoContent204", respond: status(204), ok: true},
		{name: "ServerError500", respond: status(500)},
		{name: "BadGateway502", respond: status(502)},
		{name: "RequestTimeout408", respond: status(408)},
		{name: "TooManyRequests429", respond: status(429)},
		{name: "TooManyRequests429RetryAfterSeconds", respond: status(429, "Retry-After", "7"), delay: 7 * time.Second},
		{name: "Unavailable503RetryAfterDate", respond: status(503, "Retry-After", date), delay: 90 * time.Second, slack: 3 * time.Second},
		{name: "RetryAfterGarbageIgnored", respond: status(503, "Retry-After", "soon")},
		{name: "RetryAfterCapped", respond: status(429, "Retry-After", "86400"), delay: time.Hour},
		{name: "BadRequest400", respond: status(400), permanent: true},
		{name: "NotFound404", respond: status(404), permanent: true},
		{name: "Conflict409", respond: status(409), permanent: true},
		{name: "BadRequestRetryAfterStillPermanent", respond: status(400, "Retry-After", "5"), permanent: true},
		{name: "RedirectNotFollowed", respond: status(302, "Location", "/elsewhere")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var rec recorder
			srv := rec.serve(t, tt.respond)
			h := newHandler(t, webhook.Config{URL: srv.URL + "/hook"})
			task := testTask()
			err := h(context.Background(), task)

			if len(rec.reqs) != 1 {
				t.Fatalf("server saw %d requests, want 1", len(rec.reqs))
			}
			got := rec.reqs[0]
			if got.method != http.MethodPost || got.key != task.ID.String() || got.contentType != "application/json" {
				t.Errorf("request: method %s, Idempotency-Key %q, Content-Type %q", got.method, got.key, got.contentType)
			}
			if got.body.TaskID != task.ID || got.body.Kind != task.Kind || got.body.Attempt != task.Attempt || string(got.body.Payload) != string(task.Payload) {
				t.Errorf("body = %+v, want the task %+v", got.body, task)
			}

			if tt.ok {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("err = nil, want an error")
			}
			if ingest.IsPermanent(err) != tt.permanent {
				t.Errorf("IsPermanent(%v) = %v, want %v", err, !tt.permanent, tt.permanent)
			}
			d, ok := ingest.RetryDelay(err)
			if ok != (tt.delay > 0) {
				t.Fatalf("RetryDelay(%v) = %v, %v; want a delay: %v", err, d, ok, tt.delay > 0)
			}
			if ok && (d < tt.delay-tt.slack || d > tt.delay+tt.slack) {
				t.Errorf("delay = %s, want %s ± %s", d, tt.delay, tt.slack)
			}
			if !strings.Contains(err.Error(), "answer body") {
				t.Errorf("error %q does not show the response body", err)
			}
		})
	}
}

func TestConnectionRefusedIsRetried(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	h := newHandler(t, webhook.Config{URL: "http://" + addr + "/hook"})
	err = h(context.Background(), testTask())
	if err == nil || ingest.IsPermanent(err) {
		t.Fatalf("err = %v, want a retryable error", err)
	}
	if _, ok := ingest.RetryDelay(err); ok {
		t.Fatalf("err = %v carries a delay; want the normal backoff", err)
	}
}

func TestTimeoutIsRetried(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var rec recorder
	srv := rec.serve(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release) // before srv.Close (cleanup), which waits for the handler
	h := newHandler(t, webhook.Config{URL: srv.URL, Timeout: 100 * time.Millisecond})
	start := time.Now()
	err := h(context.Background(), testTask())
	if err == nil || ingest.IsPermanent(err) {
		t.Fatalf("err = %v, want a retryable error", err)
	}
	if !strings.Contains(err.Error(), "no response within 100ms") {
		t.Errorf("err = %v, want it to say it timed out", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %s, the timeout was 100ms", el)
	}
}

func TestCancelledContextEndsRequest(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{})
	var once sync.Once
	var rec recorder
	srv := rec.serve(t, func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(arrived) })
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	h := newHandler(t, webhook.Config{URL: srv.URL})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-arrived // cancel once the request is in flight
		cancel()
	}()
	err := h(ctx, testTask())
	if !errors.Is(err, context.Canceled) || ingest.IsPermanent(err) {
		t.Fatalf("err = %v, want it to wrap context.Canceled and not be permanent", err)
	}
}

func TestSecretsStayOutOfErrors(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := rec.serve(t, status(500))
	u := strings.Replace(srv.URL, "http://", "http://user:hunter2pw@", 1) + "/hook?token=tok-secret-1"
	h := newHandler(t, webhook.Config{URL: u})
	err := h(context.Background(), testTask())
	if err == nil {
		t.Fatal("want an error")
	}
	for _, s := range []string{"hunter2pw", "tok-secret-1"} {
		if strings.Contains(err.Error(), s) {
			t.Fatalf("error %q shows the secret %q", err, s)
		}
	}

	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	h = newHandler(t, webhook.Config{URL: "http://user:hunter2pw@" + addr + "/?token=tok-secret-1"})
	err = h(context.Background(), testTask())
	if err == nil || strings.Contains(err.Error(), "hunter2pw") || strings.Contains(err.Error(), "tok-secret-1") {
		t.Fatalf("error %v: want one without secrets", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		cfg  webhook.Config
		want string
	}{
		{"Missing", webhook.Config{}, "webhook: URL: is required"},
		{"Scheme", webhook.Config{URL: "ftp://x/y"}, "webhook: URL: scheme must be http or https, got ftp://x/y"},
		{"NoHost", webhook.Config{URL: "http:///path"}, "webhook: URL: has no host"},
		{"Garbage", webhook.Config{URL: "http://a b:pw@x/%zz"}, "not a valid URL"},
		{"NegativeTimeout", webhook.Config{URL: "http://x", Timeout: -1}, "Timeout"},
		{"NegativeIdleConns", webhook.Config{URL: "http://x", IdleConns: -1}, "webhook: IdleConns: must be at least 0, got -1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := webhook.New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New(%+v) = %v, want an error containing %q", tt.cfg, err, tt.want)
			}
		})
	}
}

// TestConnectionsAreReused runs requests 32 at a time, as a busy worker
// does, and counts the connections the receiver accepted: the handler's
// own client keeps them for reuse instead of dialing per request
// (net/http's default transport keeps 2 idle connections per host).
func TestConnectionsAreReused(t *testing.T) {
	t.Parallel()
	var conns sync.Map
	var mu sync.Mutex
	opened := 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			if _, loaded := conns.LoadOrStore(c, true); !loaded {
				mu.Lock()
				opened++
				mu.Unlock()
			}
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	h := newHandler(t, webhook.Config{URL: srv.URL})
	const parallel, rounds = 32, 10
	for range rounds {
		runAtOnce(t, h, parallel)
	}
	mu.Lock()
	defer mu.Unlock()
	if opened > 2*parallel {
		t.Errorf("%d requests opened %d connections, want at most %d (reused across rounds)", parallel*rounds, opened, 2*parallel)
	}
	t.Logf("%d requests, %d at a time: %d connections", parallel*rounds, parallel, opened)
}

// TestIdleConnsFollowHandlers runs more requests at once than
// DefaultIdleConns, all in flight together (the receiver holds each until
// all have arrived), three rounds, with IdleConns from IdleConnsFor: the
// client keeps a connection per request for the next round instead of
// closing those beyond the default and dialing them again.
func TestIdleConnsFollowHandlers(t *testing.T) {
	t.Parallel()
	if got := webhook.IdleConnsFor(16); got != webhook.DefaultIdleConns {
		t.Errorf("IdleConnsFor(16) = %d, want %d", got, webhook.DefaultIdleConns)
	}
	const parallel, rounds = webhook.DefaultIdleConns + 64, 3
	if got := webhook.IdleConnsFor(parallel); got != parallel {
		t.Errorf("IdleConnsFor(%d) = %d", parallel, got)
	}
	var mu sync.Mutex
	opened, inside := 0, 0
	all := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		if inside++; inside == parallel {
			close(all)
		}
		ch := all
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(30 * time.Second): // a client that never had them all in flight: counted below
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	h := newHandler(t, webhook.Config{URL: srv.URL, IdleConns: webhook.IdleConnsFor(parallel)})
	for range rounds {
		runAtOnce(t, h, parallel)
		mu.Lock()
		inside, all = 0, make(chan struct{})
		mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	// Each round has every request in flight at once, so the first opens
	// parallel connections; the later ones find them idle (a few may not
	// be back in the pool yet when a request starts). With the default's
	// 256 idle, each later round opens the 64 beyond it again.
	if most := parallel + 16; opened > most {
		t.Errorf("%d rounds of %d requests at once opened %d connections, want at most %d", rounds, parallel, opened, most)
	}
	t.Logf("%d rounds of %d requests at once: %d connections", rounds, parallel, opened)
}

// runAtOnce runs n requests of h at once and waits for them.
func runAtOnce(t *testing.T, h ingest.Handler, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if err := h(context.Background(), testTask()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestResultFromResponse: a 2xx JSON body is the result; a body of another
// type, or an empty one, is none; a JSON body over the limit, or invalid,
// fails the run (retryable) saying so; New's handler keeps no result.
func TestResultFromResponse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, ctype, body string
		want              string // the result; "" none
		err               string
	}{
		{name: "JSON", ctype: "application/json; charset=utf-8", body: `{"pages": 3}`, want: `{"pages": 3}`},
		{name: "ProblemJSON", ctype: "application/vnd.api+json", body: `[1,2]`, want: `[1,2]`},
		{name: "Text", ctype: "text/plain", body: `{"pages": 3}`},
		{name: "NoType", body: `ok`},
		{name: "EmptyJSON", ctype: "application/json"},
		{name: "TooLarge", ctype: "application/json", body: `"` + strings.Repeat("x", 40) + `"`, err: "larger than 32 bytes (INGEST_RESULT_MAX_BYTES)"},
		{name: "Invalid", ctype: "application/json", body: `{"pages":`, err: "not valid JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tc.ctype != "" {
					w.Header().Set("Content-Type", tc.ctype)
				}
				_, _ = w.Write([]byte(tc.body))
			}))
			t.Cleanup(srv.Close)
			h, err := webhook.NewResult(webhook.Config{URL: srv.URL, MaxResultBytes: 32})
			if err != nil {
				t.Fatal(err)
			}
			got, err := h(context.Background(), testTask())
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) || ingest.IsPermanent(err) {
					t.Errorf("error %v, want a retryable one with %q", err, tc.err)
				}
			case err != nil || string(got) != tc.want:
				t.Errorf("result %q, %v; want %q", got, err, tc.want)
			}
			if err := newHandler(t, webhook.Config{URL: srv.URL, MaxResultBytes: 32})(context.Background(), testTask()); (err == nil) != (tc.err == "") {
				t.Errorf("New's handler: %v", err)
			}
		})
	}
	if _, err := webhook.NewResult(webhook.Config{URL: "http://x", MaxResultBytes: 1}); err == nil || !strings.Contains(err.Error(), "MaxResultBytes") {
		t.Errorf("MaxResultBytes 1: %v, want an error naming it", err)
	}
}

// TestDependenciesInBody: the results of a task's dependencies go in the
// request body's dependencies object, keyed by task id; a task without
// dependencies has none.
func TestDependenciesInBody(t *testing.T) {
	t.Parallel()
	var rec recorder
	srv := rec.serve(t, status(http.StatusOK))
	h := newHandler(t, webhook.Config{URL: srv.URL})
	dep := uuid.New()
	tk := testTask()
	tk.Dependencies = map[uuid.UUID]json.RawMessage{dep: json.RawMessage(`{"pages":3}`)}
	if err := h(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	if err := h(context.Background(), testTask()); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := rec.reqs[0].body.Dependencies; len(got) != 1 || string(got[dep]) != `{"pages":3}` {
		t.Errorf("dependencies = %v, want the result of %s", got, dep)
	}
	if got := rec.reqs[1].body.Dependencies; got != nil {
		t.Errorf("dependencies of a task without any = %v, want none", got)
	}
}
