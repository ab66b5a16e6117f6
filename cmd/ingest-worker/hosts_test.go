package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
)

// TestBinaryRefusesForeignHosts: every HTTP server the binary starts (run's,
// which demo shares, and ui's) refuses a Host outside
// INGEST_HTTP_ALLOWED_HOSTS before anything else, on every path: a page of
// an attacker's domain re-pointed at 127.0.0.1 (DNS rebinding) gets
// neither the dashboard and its CSRF token, nor the API, nor the metrics.
func TestBinaryRefusesForeignHosts(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(hook.Close)
	env := []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey, "INGEST_CONSUMER_NAME=hosts-test"}
	client := &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, addr, host, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(`{"kind":"x","payload":{}}`))
		req.Host = host
		if method != http.MethodGet {
			req.Header.Set("Origin", "http://"+host) // the attacker's page is same-origin with itself
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	refused := func(what, addr string, hosts ...string) {
		t.Helper()
		_, port, _ := net.SplitHostPort(addr)
		for _, host := range hosts {
			host = strings.ReplaceAll(host, "PORT", port)
			for _, rt := range [][2]string{{"GET", "/ui/kinds"}, {"GET", "/ui/"}, {"GET", "/v1/tasks"}, {"POST", "/v1/tasks"},
				{"POST", "/ui/kinds/x"}, {"GET", "/metrics"}, {"GET", "/healthz"}, {"GET", "/readyz"}, {"GET", "/"}} {
				code, body := do(rt[0], addr, host, rt[1])
				if code != http.StatusMisdirectedRequest || !strings.Contains(body, "INGEST_HTTP_ALLOWED_HOSTS") || strings.Contains(body, "csrf") {
					t.Fatalf("%s: %s %s with Host %s: %d, want 421 naming INGEST_HTTP_ALLOWED_HOSTS\n%s", what, rt[0], rt[1], host, code, body)
				}
			}
		}
	}
	allowed := func(what, addr string, hosts ...string) {
		t.Helper()
		_, port, _ := net.SplitHostPort(addr)
		for _, host := range hosts {
			host = strings.ReplaceAll(host, "PORT", port)
			for _, path := range []string{"/ui/", "/v1/tasks", "/healthz"} {
				if code, body := do("GET", addr, host, path); code != http.StatusOK {
					t.Fatalf("%s: GET %s with Host %s: %d, want 200\n%s", what, path, host, code, body)
				}
			}
		}
	}

	// run, with the default list: the loopback names and the listen address.
	addr := freeAddr(t)
	worker := start(t, bin, env, "run", "--http-addr", addr, "--webhook-url", hook.URL)
	waitReady(t, worker, addr)
	refused("run", addr, "rebind.evil.example:PORT", "rebind.evil.example", "localhost.evil.example:PORT")
	allowed("run", addr, "127.0.0.1:PORT", "localhost:PORT", "LOCALHOST", "[::1]:PORT")
	if code, _ := do("GET", addr, "127.0.0.1:PORT", "/metrics"); code != http.StatusOK {
		t.Fatalf("run's /metrics on 127.0.0.1: %d", code)
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM ingest_task`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tasks after refused POSTs (%v)", n, err)
	}

	// ui, with names listed: those and the loopback names.
	uiAddr := freeAddr(t)
	dash := start(t, bin, append(env, "INGEST_HTTP_ALLOWED_HOSTS=ingest.example.com, 10.1.2.3"), "ui", "--http-addr", uiAddr)
	testenv.Eventually(t, 20*time.Second, "ui to listen", func() bool {
		dash.mustBeRunning()
		resp, err := http.Get("http://" + uiAddr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	refused("ui", uiAddr, "rebind.evil.example:PORT", "ingest.example.com.evil.example")
	allowed("ui", uiAddr, "ingest.example.com:PORT", "Ingest.Example.COM", "10.1.2.3:PORT", "127.0.0.1:PORT")

	// A bad list stops start-up, naming the setting.
	if r := runBin(t, bin, append(env, "INGEST_HTTP_ALLOWED_HOSTS=https://ingest.example.com/"), "", "ui", "--http-addr", freeAddr(t)); r.code != exitUsage ||
		!strings.Contains(r.stderr, "INGEST_HTTP_ALLOWED_HOSTS") {
		t.Fatalf("ui with a URL in INGEST_HTTP_ALLOWED_HOSTS: exit %d, %q", r.code, r.stderr)
	}
}
