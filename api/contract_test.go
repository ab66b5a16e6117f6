package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/internal/testenv"
)

// contract is the real binary (ingest-worker run, with its webhook handler)
// behind prism in validation-proxy mode: every request goes through prism,
// which checks it and the binary's answer against api/openapi.json.
type contract struct {
	base   string // prism's URL
	token  string
	worker *testenv.Buffer // the binary's log
	prism  *testenv.Buffer // prism's log
	seen   map[string]bool // "METHOD /path" of each request sent through prism
	// reporting receives each webhook call of a task of kind "reporting";
	// the receiver answers it once the test closes its release.
	reporting chan hookCall
}

// hookCall is a webhook call the receiver holds for the test: the task and
// the attempt the worker gave it, as an external handler reads them.
type hookCall struct {
	TaskID  string `json:"task_id"`
	Attempt int    `json:"attempt"`
	release chan struct{}
}

// contractPayloadLimit is the binary's INGEST_MAX_PAYLOAD_BYTES here: small,
// so that a 413 needs no large body.
const contractPayloadLimit = 4096

// hookResult is what the webhook receiver answers every call with: the
// task's result once the server stores one.
const hookResult = `{"echoed":true,"n":42}`

// startProcess starts cmd (its output to log) and stops it when the test
// ends: SIGTERM, then SIGKILL after 30 s.
func startProcess(t *testing.T, cmd *exec.Cmd, log *testenv.Buffer) <-chan struct{} {
	t.Helper()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// The process group: prism's node forks nothing, but a wrapper
		// script would.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	return done
}

// startContract builds and starts the binary against the test's PostgreSQL
// and Redis, and prism in front of it; both are ready when it returns.
func startContract(t *testing.T) *contract {
	t.Helper()
	prism := testenv.NodeBin(t, "prism")
	bin := filepath.Join(t.TempDir(), "ingest-worker")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/ingest-worker/ingest/cmd/ingest-worker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/ingest-worker: %v\n%s", err, out)
	}
	db := testenv.NewDatabase(t)
	streamKey, dlqKey := testenv.Keys(t)
	reporting := make(chan hookCall)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var call struct {
			Kind string `json:"kind"`
			hookCall
		}
		_ = json.NewDecoder(r.Body).Decode(&call)
		switch call.Kind {
		case "slow":
			// Runs until the worker cancels it (a cancel, the
			// worker's shutdown).
			<-r.Context().Done()
			return
		case "reporting":
			// Runs while the test reports its progress with the
			// attempt it was given.
			call.release = make(chan struct{})
			select {
			case reporting <- call.hookCall:
			case <-r.Context().Done():
				return
			}
			select {
			case <-call.release:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, hookResult)
	}))
	t.Cleanup(hook.Close)

	c := &contract{token: "contract-token", worker: &testenv.Buffer{}, prism: &testenv.Buffer{}, seen: map[string]bool{}, reporting: reporting}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ingest-worker run's log:\n%s\nprism's log:\n%s", c.worker.String(), c.prism.String())
		}
	})
	run := exec.Command(bin, "run")
	run.Env = []string{
		"INGEST_DATABASE_URL=" + db.URL,
		"INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + streamKey,
		"INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_HTTP_ADDR=127.0.0.1:0",
		"INGEST_API_TOKEN=" + c.token,
		"INGEST_WEBHOOK_URL=" + hook.URL,
		"INGEST_MAX_PAYLOAD_BYTES=" + strconv.Itoa(contractPayloadLimit),
		`INGEST_PERIODIC=[{"kind":"held","cron":"0 3 1 1 *"}]`,
		"INGEST_SHUTDOWN_TIMEOUT_MS=2000",
		"INGEST_LOG_FORMAT=json",
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "INGEST_") && !strings.HasPrefix(kv, "PG") {
			run.Env = append(run.Env, kv)
		}
	}
	done := startProcess(t, run, c.worker)
	var upstream string
	testenv.Eventually(t, 60*time.Second, "ingest-worker run to listen", func() bool {
		select {
		case <-done:
			t.Fatalf("ingest-worker run exited:\n%s", c.worker.String())
		default:
		}
		for line := range strings.Lines(c.worker.String()) {
			var rec struct {
				Msg  string `json:"msg"`
				HTTP string `json:"http"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "ingest-worker running" && rec.HTTP != "" {
				upstream = "http://" + rec.HTTP
				return true
			}
		}
		return false
	})

	// prism's upstream passes every request to the binary, but for those
	// marked with unavailableHeader (below).
	binURL, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	direct := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(binURL) }}
	dead := unavailableServer(t)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(unavailableHeader) != "" {
			dead.ServeHTTP(w, r)
			return
		}
		direct.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)

	free, err := pgtemp.FreePort() // free a moment ago: prism listens on it
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(free)
	c.base = "http://127.0.0.1:" + port
	px := exec.Command(prism, "proxy", "--errors", "--cors=false", "-h", "127.0.0.1", "-p", port, "openapi.json", front.URL)
	px.Env = nodeEnv()
	pdone := startProcess(t, px, c.prism)
	testenv.Eventually(t, 60*time.Second, "ingest-worker run to be ready", func() bool {
		return httpStatus(t, upstream+"/readyz", done, c.worker) == http.StatusOK
	})
	// prism listens once it has read the document: seconds.
	testenv.Eventually(t, 90*time.Second, "prism to listen", func() bool {
		return httpStatus(t, c.base+"/healthz", pdone, c.prism) != 0
	})
	return c
}

// unavailableHeader marks a request that prism's upstream answers with
// unavailableServer instead of the binary.
const unavailableHeader = "X-Contract-Unavailable"

// unavailableServer is the API handler of the binary with its PostgreSQL
// unreachable (a port nothing listens on): its answers are the 503s a
// binary gives while its database is down, and /readyz's 503.
func unavailableServer(t *testing.T) http.Handler {
	t.Helper()
	store, pool, _ := unreachableStore(t)
	h, err := api.New(api.Config{}, store, api.Checks{"postgres": pool.Ping}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// httpStatus GETs url and returns the status, 0 when nothing answers; the
// test fails if the process that should answer (done) has exited.
func httpStatus(t *testing.T, url string, done <-chan struct{}, log *testenv.Buffer) int {
	t.Helper()
	select {
	case <-done:
		t.Fatalf("the process behind %s exited:\n%s", url, log.String())
	default:
	}
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// call sends a request through prism (with the token unless noToken) and
// fails the test if prism found the request or the answer in breach of the
// document: a violation header (any severity), or an error of prism's own
// (problem+json) instead of the binary's answer.
func (c *contract) call(t *testing.T, method, path, body string, header ...string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, c.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	c.seen[method+" "+req.URL.Path] = true
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] == "" {
			req.Header.Del(header[i])
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s through prism: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	if v := resp.Header.Get("sl-violations"); v != "" {
		t.Fatalf("%s %s: %d breaks api/openapi.json: %s\nbody: %s", method, path, resp.StatusCode, v, data)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") || bytes.Contains(data, []byte("stoplight.io/prism/errors")) {
		t.Fatalf("%s %s: prism answered instead of the binary (%d): %s", method, path, resp.StatusCode, data)
	}
	return response{resp.StatusCode, resp.Header, data}
}

// expect calls and fails the test unless the answer has code; for an
// error it also checks the field named.
func (c *contract) expect(t *testing.T, code int, field, method, path, body string, header ...string) response {
	t.Helper()
	res := c.call(t, method, path, body, header...)
	if res.code != code {
		t.Fatalf("%s %s: %d %s, want %d", method, path, res.code, res.body, code)
	}
	if code >= 400 && code != http.StatusMisdirectedRequest {
		if _, f := res.errorBody(t); f != field {
			t.Fatalf("%s %s: field %q, want %q (%s)", method, path, f, field, res.body)
		}
	}
	return res
}

// TestOpenAPIContract runs the real binary behind prism's validating proxy
// and drives every route and every error class the document describes
// through it, then a TypeScript client generated from the document; any
// request or answer that breaks the document fails the test. prism starts
// once for all of it.
func TestOpenAPIContract(t *testing.T) {
	t.Parallel()
	client := prepareTSClient(t)
	c := startContract(t)

	t.Run("probes and document", func(t *testing.T) {
		c.expect(t, http.StatusOK, "", "GET", "/healthz", "")
		c.expect(t, http.StatusOK, "", "GET", "/readyz", "")
		c.expect(t, http.StatusOK, "", "GET", "/metrics", "")
		res := c.expect(t, http.StatusOK, "", "GET", "/v1/openapi.json", "", "Authorization", "")
		c.expect(t, http.StatusNotModified, "", "GET", "/v1/openapi.json", "", "If-None-Match", res.header.Get("ETag"))
		c.expect(t, http.StatusOK, "", "GET", "/v1/periodic", "")
	})

	t.Run("errors", func(t *testing.T) {
		// 401: the token is optional in the document (a server without
		// INGEST_API_TOKEN needs none), so prism passes the request on.
		res := c.expect(t, http.StatusUnauthorized, "Authorization", "GET", "/v1/tasks", "", "Authorization", "")
		if res.header.Get("WWW-Authenticate") == "" {
			t.Error("401 without WWW-Authenticate")
		}
		c.expect(t, http.StatusForbidden, "Sec-Fetch-Site", "POST", "/v1/tasks", `{"kind":"held","payload":{}}`, "Sec-Fetch-Site", "cross-site")
		// 400s the document cannot see: a control character in a kind,
		// an unknown query parameter, a rate that is none.
		c.expect(t, http.StatusBadRequest, "kind", "POST", "/v1/tasks", `{"kind":"a\u0007b","payload":{}}`)
		c.expect(t, http.StatusBadRequest, "[1].kind", "POST", "/v1/tasks:batch", `[{"kind":"held","payload":1},{"kind":"a\u0007b","payload":2}]`)
		c.expect(t, http.StatusBadRequest, "bogus", "GET", "/v1/tasks?bogus=1", "")
		c.expect(t, http.StatusBadRequest, "rate", "PUT", "/v1/kinds/held", `{"rate":"fast"}`)
		c.expect(t, http.StatusBadRequest, "since", "POST", "/v1/tasks/redrive", `{"status":"DEAD","since":"2026-11-24T09:00:00Z","until":"2026-11-23T09:00:00Z"}`)
		big := fmt.Sprintf(`{"kind":"held","payload":{"s":%q}}`, strings.Repeat("x", contractPayloadLimit))
		c.expect(t, http.StatusRequestEntityTooLarge, "payload", "POST", "/v1/tasks", big)
		missing := "/v1/tasks/" + uuid.NewString()
		c.expect(t, http.StatusNotFound, "id", "GET", missing, "")
		c.expect(t, http.StatusNotFound, "id", "DELETE", missing, "")
		c.expect(t, http.StatusNotFound, "id", "POST", missing+"/run", "")
		c.expect(t, http.StatusNotFound, "id", "POST", missing+"/redrive", "")
		c.expect(t, http.StatusNotFound, "id", "POST", missing+"/cancel", "")
		c.expect(t, http.StatusNotFound, "id", "POST", missing+"/progress", `{"attempt":1,"percent":10}`)
		c.expect(t, http.StatusBadRequest, "wait", "GET", missing+"?wait=61s", "")
	})

	t.Run("task lifecycle", func(t *testing.T) {
		// Tasks of the paused kind "held" never start, so each state
		// below is the test's doing.
		c.expect(t, http.StatusOK, "", "PUT", "/v1/kinds/held", `{"paused":true,"concurrency":2,"rate":"10/s"}`)
		first := decode[struct{ ID string }](t, c.expect(t, http.StatusCreated, "", "POST", "/v1/tasks", `{"kind":"held","payload":{"n":1},"idempotency_key":"k-1","max_attempts":3,"timeout_ms":1000}`))
		again := decode[struct{ ID string }](t, c.expect(t, http.StatusOK, "", "POST", "/v1/tasks", `{"kind":"held","payload":{"n":1},"idempotency_key":"k-1"}`))
		if again.ID != first.ID {
			t.Fatalf("a repeated idempotency key answered task %s, want %s", again.ID, first.ID)
		}
		c.expect(t, http.StatusCreated, "", "POST", "/v1/tasks:batch", `[{"kind":"held","payload":[1]},{"kind":"held","payload":"two","idempotency_key":"k-2"}]`)
		c.expect(t, http.StatusOK, "", "POST", "/v1/tasks:batch", `[{"kind":"held","payload":"two","idempotency_key":"k-2"}]`)
		later := decode[struct{ ID string }](t, c.expect(t, http.StatusCreated, "", "POST", "/v1/tasks", `{"kind":"held","payload":{},"delay_ms":3600000}`))
		c.expect(t, http.StatusCreated, "", "POST", "/v1/tasks", `{"kind":"held","payload":true,"run_at":"2036-01-02T15:04:05Z"}`)

		id := "/v1/tasks/" + first.ID
		c.expect(t, http.StatusOK, "", "GET", id, "")
		c.expect(t, http.StatusOK, "", "GET", id+"?wait=1ms", "")
		c.expect(t, http.StatusOK, "", "GET", "/v1/tasks?status=scheduled&kind=held&limit=10", "")
		page := decode[struct {
			NextCursor string `json:"next_cursor"`
		}](t, c.expect(t, http.StatusOK, "", "GET", "/v1/tasks?status=QUEUED&limit=1", ""))
		if page.NextCursor == "" {
			t.Fatal("a page of 1 of several tasks has no next_cursor")
		}
		c.expect(t, http.StatusOK, "", "GET", "/v1/tasks?limit=1&cursor="+page.NextCursor, "")

		c.expect(t, http.StatusOK, "", "POST", "/v1/tasks/"+later.ID+"/run", "")
		c.expect(t, http.StatusConflict, "id", "POST", "/v1/tasks/"+later.ID+"/run", "")
		c.expect(t, http.StatusConflict, "id", "DELETE", id, "")
		c.expect(t, http.StatusConflict, "id", "POST", id+"/redrive", "")
		c.expect(t, http.StatusOK, "", "POST", id+"/cancel", `{"reason":"contract test"}`)
		c.expect(t, http.StatusConflict, "id", "POST", id+"/cancel", "")
		c.expect(t, http.StatusOK, "", "POST", "/v1/tasks/redrive", `{"status":"CANCELLED","kind":"held","dry_run":true}`)
		c.expect(t, http.StatusOK, "", "POST", id+"/redrive", "")
		c.expect(t, http.StatusOK, "", "POST", id+"/cancel", "")
		c.expect(t, http.StatusOK, "", "POST", "/v1/tasks/redrive", `{"status":"CANCELLED","ids":["`+first.ID+`"],"limit":10}`)
		c.expect(t, http.StatusOK, "", "POST", id+"/cancel", "")
		c.expect(t, http.StatusNoContent, "", "DELETE", id, "")
		c.expect(t, http.StatusNotFound, "id", "GET", id, "")
		c.expect(t, http.StatusOK, "", "GET", "/v1/kinds", "")
		c.expect(t, http.StatusOK, "", "PUT", "/v1/kinds/held", `{"group_weights":{"tenant-a":3}}`)
		c.expect(t, http.StatusOK, "", "GET", "/v1/kinds/held", "")
		c.expect(t, http.StatusNotFound, "kind", "GET", "/v1/kinds/none-such", "")
		c.expect(t, http.StatusOK, "", "GET", "/v1/sequences/blocked?kind=held&limit=10", "")

		// A RUNNING task's cancel: 202, and it ends CANCELLED.
		slow := decode[struct{ ID string }](t, c.expect(t, http.StatusCreated, "", "POST", "/v1/tasks", `{"kind":"slow","payload":{}}`))
		id = "/v1/tasks/" + slow.ID
		status := func() string {
			return decode[struct{ Status string }](t, c.expect(t, http.StatusOK, "", "GET", id, "")).Status
		}
		testenv.Eventually(t, 30*time.Second, "the slow task to run", func() bool { return status() == "RUNNING" })
		c.expect(t, http.StatusAccepted, "", "POST", id+"/cancel", `{"reason":"contract test"}`)
		testenv.Eventually(t, 30*time.Second, "the slow task to end CANCELLED", func() bool { return status() == "CANCELLED" })
	})

	t.Run("progress", func(t *testing.T) {
		// The receiver holds the run of a "reporting" task while the
		// test reports for it, as an external handler does, with the
		// attempt of the webhook request.
		created := decode[struct{ ID string }](t, c.expect(t, http.StatusCreated, "", "POST", "/v1/tasks", `{"kind":"reporting","payload":{}}`))
		var run hookCall
		select {
		case run = <-c.reporting:
		case <-time.After(60 * time.Second):
			t.Fatal("the webhook receiver got no call of the reporting task within 60 s")
		}
		if run.TaskID != created.ID || run.Attempt != 1 {
			t.Fatalf("webhook call of task %s attempt %d, want task %s attempt 1", run.TaskID, run.Attempt, created.ID)
		}
		id := "/v1/tasks/" + created.ID
		report := func(attempt, percent int) string {
			return fmt.Sprintf(`{"attempt":%d,"percent":%d,"message":"page 4 of 10"}`, attempt, percent)
		}
		c.expect(t, http.StatusNoContent, "", "POST", id+"/progress", report(run.Attempt, 40))
		c.expect(t, http.StatusConflict, "attempt", "POST", id+"/progress", report(run.Attempt+1, 50))
		// A 400 the document cannot see: its maxLength counts
		// characters, the server bytes (400 characters of 3 bytes).
		long := fmt.Sprintf(`{"attempt":%d,"percent":50,"message":%q}`, run.Attempt, strings.Repeat("€", 400))
		c.expect(t, http.StatusBadRequest, "message", "POST", id+"/progress", long)
		type detail struct {
			Status   string
			Result   json.RawMessage
			Progress *struct{ Percent int }
		}
		running := decode[detail](t, c.expect(t, http.StatusOK, "", "GET", id, ""))
		if running.Status != "RUNNING" || running.Progress == nil || running.Progress.Percent != 40 || string(running.Result) != "null" {
			t.Fatalf("the reporting task while it runs: %+v (result %s), want RUNNING with progress 40 and a null result", running, running.Result)
		}
		close(run.release)
		done := decode[detail](t, c.expect(t, http.StatusOK, "", "GET", id+"?wait=30s", ""))
		if done.Status != "SUCCEEDED" || !sameJSON(t, done.Result, hookResult) || done.Progress == nil || done.Progress.Percent != 40 {
			t.Fatalf("GET ?wait=30s of the reporting task: %+v (result %s), want SUCCEEDED with result %s and progress 40", done, done.Result, hookResult)
		}
		// The run has ended: its attempt is stale now.
		c.expect(t, http.StatusConflict, "attempt", "POST", id+"/progress", report(run.Attempt, 100))
	})

	t.Run("database unavailable", func(t *testing.T) {
		down := []string{unavailableHeader, "1"}
		if res := c.call(t, "GET", "/readyz", "", down...); res.code != http.StatusServiceUnavailable {
			t.Errorf("GET /readyz with PostgreSQL down: %d %s, want 503", res.code, res.body)
		}
		for _, rt := range [][3]string{
			{"POST", "/v1/tasks", `{"kind":"k","payload":{}}`},
			{"GET", "/v1/tasks/" + uuid.NewString(), ""},
			{"GET", "/v1/kinds", ""},
		} {
			res := c.expect(t, http.StatusServiceUnavailable, "", rt[0], rt[1], rt[2], down...)
			if s, err := strconv.Atoi(res.header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("%s %s: Retry-After %q, want whole seconds", rt[0], rt[1], res.header.Get("Retry-After"))
			}
		}
	})

	t.Run("every operation exercised", func(t *testing.T) {
		for _, op := range documentedRoutes(t, openAPI(t)) {
			method, tmpl, _ := strings.Cut(op, " ")
			if !slices.ContainsFunc(slices.Collect(maps.Keys(c.seen)), func(sent string) bool {
				m, path, _ := strings.Cut(sent, " ")
				return m == method && matchesTemplate(tmpl, path)
			}) {
				t.Errorf("%s is in api/openapi.json but the contract test sends no request to it", op)
			}
		}
	})

	t.Run("typescript client", func(t *testing.T) {
		out := client.run(t, c, "echo", `{"hello":"world"}`)
		var final struct {
			ID          string          `json:"id"`
			Status      string          `json:"status"`
			Result      json.RawMessage `json:"result"`
			Transitions int             `json:"transitions"`
		}
		if err := json.Unmarshal([]byte(lastLine(out)), &final); err != nil {
			t.Fatalf("the client printed %q: %v", out, err)
		}
		if final.Status != "SUCCEEDED" || final.Transitions < 3 || !sameJSON(t, final.Result, hookResult) {
			t.Fatalf("the client's final task: %s, want SUCCEEDED with its transitions and the webhook's answer %s as its result", out, hookResult)
		}
		t.Logf("final task: %s", out)
	})
}

// sameJSON reports whether got is the JSON value want (any spacing or key
// order).
func sameJSON(t *testing.T, got json.RawMessage, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want %q is not JSON: %v", want, err)
	}
	return json.Unmarshal(got, &g) == nil && reflect.DeepEqual(g, w)
}

// matchesTemplate reports whether path fits an OpenAPI path template
// ("/v1/tasks/{id}/run"): segment by segment, a {name} matching any one.
func matchesTemplate(tmpl, path string) bool {
	ts, ps := strings.Split(tmpl, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		return false
	}
	for i, seg := range ts {
		if !(strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") && ps[i] != "") && seg != ps[i] {
			return false
		}
	}
	return true
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// tsClient is testdata/tsclient/roundtrip.ts in a directory of its own,
// with the TypeScript types of api/openapi.json generated beside it
// (openapi-typescript) and type checked against them (tsc --noEmit).
type tsClient struct {
	dir, tsx string
	ready    chan struct{} // closed when err is set
	err      error
}

// prepareTSClient generates and type checks the client in the background
// (that needs no server), while the test starts the servers.
func prepareTSClient(t *testing.T) *tsClient {
	t.Helper()
	gen, tsc := testenv.NodeBin(t, "openapi-typescript"), testenv.NodeBin(t, "tsc")
	c := &tsClient{dir: t.TempDir(), tsx: testenv.NodeBin(t, "tsx"), ready: make(chan struct{})}
	for _, name := range []string{"roundtrip.ts", "tsconfig.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", "tsclient", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The tools' packages (openapi-fetch, @types/node) resolve from here.
	if err := os.Symlink(testenv.NodeModules(t), filepath.Join(c.dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	doc, err := filepath.Abs("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	go func() {
		defer close(c.ready)
		defer cancel()
		if _, c.err = runNode(ctx, c.dir, gen, nil, doc, "-o", "schema.ts"); c.err == nil {
			_, c.err = runNode(ctx, c.dir, tsc, nil, "-p", "tsconfig.json")
		}
	}()
	t.Cleanup(func() { <-c.ready }) // before the directory is removed
	return c
}

// run runs the client through the contract's prism, creating one task of
// kind with payload; it returns what the script printed.
func (c *tsClient) run(t *testing.T, ct *contract, kind, payload string) string {
	t.Helper()
	<-c.ready
	if c.err != nil {
		t.Fatal(c.err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	out, err := runNode(ctx, c.dir, c.tsx, []string{
		"INGEST_API_URL=" + ct.base,
		"INGEST_API_TOKEN=" + ct.token,
		"TASK_KIND=" + kind,
		"TASK_PAYLOAD=" + payload,
		"TASK_RESULT=" + hookResult,
	}, "roundtrip.ts")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runNode runs one of the Node.js tools in dir and returns its standard
// output; an error carries both outputs.
func runNode(ctx context.Context, dir, tool string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Dir, cmd.Env = dir, nodeEnv(env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", filepath.Base(tool), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}
