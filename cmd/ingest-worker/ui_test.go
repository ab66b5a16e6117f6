package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
)

// TestBinaryDashboard: run serves the dashboard next to the API; ui serves
// it with the task API's reads, the token's login form and read-only mode.
func TestBinaryDashboard(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(hook.Close)
	env := []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey, "INGEST_CONSUMER_NAME=ui-test"}
	noRedirect := &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(url string) (int, string, http.Header) {
		t.Helper()
		resp, err := noRedirect.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}

	addr := freeAddr(t)
	worker := start(t, bin, env, "run", "--http-addr", addr, "--webhook-url", hook.URL)
	waitReady(t, worker, addr)
	if code, body, _ := get("http://" + addr + "/ui/"); code != 200 || !strings.Contains(body, "Overview") || !strings.Contains(body, "ui-test") {
		t.Fatalf("run's /ui/: %d\n%s", code, body)
	}
	if code, _, h := get("http://" + addr + "/ui"); code != http.StatusMovedPermanently || h.Get("Location") != "/ui/" {
		t.Fatalf("run's /ui: %d %q", code, h.Get("Location"))
	}
	// / redirects to the dashboard wherever it is served (run, demo, ui).
	if code, _, h := get("http://" + addr + "/"); code != http.StatusFound || h.Get("Location") != "/ui/" {
		t.Fatalf("run's /: %d %q", code, h.Get("Location"))
	}
	if code, body, _ := get("http://" + addr + "/v1/tasks"); code != 200 || !strings.Contains(body, `"tasks"`) {
		t.Fatalf("run's API next to the dashboard: %d %s", code, body)
	}

	uiAddr := freeAddr(t)
	dash := start(t, bin, append(env, "INGEST_API_TOKEN=dash-token", "INGEST_UI_READONLY=true"), "ui", "--http-addr", uiAddr)
	testenv.Eventually(t, 20*time.Second, "ui to listen", func() bool {
		dash.mustBeRunning()
		resp, err := http.Get("http://" + uiAddr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	if code, body, _ := get("http://" + uiAddr + "/ui/"); code != http.StatusUnauthorized || !strings.Contains(body, `name="token"`) {
		t.Fatalf("ui with a token, no session: %d\n%s", code, body)
	}
	if code, _, h := get("http://" + uiAddr + "/"); code != http.StatusFound || h.Get("Location") != "/ui/" {
		t.Fatalf("ui's /: %d %q", code, h.Get("Location"))
	}
	// The task API's reads, with the token; no writes.
	if code, _, _ := get("http://" + uiAddr + "/v1/tasks"); code != http.StatusUnauthorized {
		t.Fatalf("ui's task API without the token: %d", code)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+uiAddr+"/v1/tasks", nil)
	req.Header.Set("Authorization", "Bearer dash-token")
	if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("ui's GET /v1/tasks with the token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	req, _ = http.NewRequest(http.MethodPost, "http://"+uiAddr+"/v1/tasks", strings.NewReader(`{"kind":"x","payload":{}}`))
	req.Header.Set("Authorization", "Bearer dash-token")
	if resp, err := noRedirect.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("ui's POST /v1/tasks: %v %v, want 405", resp, err)
	} else {
		resp.Body.Close()
	}
	if r := runBin(t, bin, append(env, "INGEST_HTTP_ADDR="), "", "ui"); r.code != exitUsage || !strings.Contains(r.stderr, "INGEST_HTTP_ADDR") {
		t.Fatalf("ui without an address: exit %d, %q", r.code, r.stderr)
	}
}
