package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/api"
)

// TestCrossSiteRequestsRefused: a page on another site cannot drive the
// API through the user's browser (a text/plain POST needs no preflight),
// with or without a token; clients that send neither Origin nor
// Sec-Fetch-Site, and this origin's own pages, still can.
func TestCrossSiteRequestsRefused(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"", "s3cret-token"} {
		b := setup(t, options{token: token, dlq: true})
		for _, tt := range []struct{ method, path, body string }{
			{"POST", "/v1/tasks", `{"kind":"evil","payload":{}}`},
			{"POST", "/v1/tasks/redrive", `{"status":"DEAD"}`},
		} {
			for _, h := range [][]string{
				{"Content-Type", "text/plain", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"},
				{"Content-Type", "text/plain", "Sec-Fetch-Site", "cross-site"},
				{"Content-Type", "text/plain", "Origin", "https://evil.example"},
			} {
				r := b.do(t, tt.method, tt.path, tt.body, h...)
				if r.code != http.StatusForbidden {
					t.Fatalf("token %q: %s %s with %v: %d %s, want 403", token, tt.method, tt.path, h, r.code, r.body)
				}
				if msg, _ := r.errorBody(t); !strings.Contains(msg, "cross-origin") {
					t.Fatalf("403 body %q does not say why", msg)
				}
			}
		}
		if r := b.do(t, "GET", "/v1/tasks?kind=evil", ""); !strings.Contains(string(r.body), `"tasks":[]`) {
			t.Fatalf("token %q: a refused create left a task: %s", token, r.body)
		}
		// curl and this origin's pages.
		if r := b.do(t, "POST", "/v1/tasks", `{"kind":"ok","payload":{}}`); r.code != http.StatusCreated {
			t.Fatalf("token %q: a POST without Origin: %d %s", token, r.code, r.body)
		}
		if r := b.do(t, "POST", "/v1/tasks", `{"kind":"ok","payload":{}}`, "Origin", b.srv.URL, "Sec-Fetch-Site", "same-origin"); r.code != http.StatusCreated {
			t.Fatalf("token %q: a same-origin POST: %d %s", token, r.code, r.body)
		}
	}
}

// TestEveryStateChangingRouteRefusesCrossSite walks the server's own route
// table, so that a route added later is covered without editing this test.
func TestEveryStateChangingRouteRefusesCrossSite(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: "s3cret-token", gatherer: prometheus.NewRegistry()})
	id := uuid.NewString()
	fill := strings.NewReplacer("{id}", id, "{kind}", "k")
	h, err := api.New(api.Config{}, b.store, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var unsafe int
	for _, pattern := range h.Routes() {
		method, path, ok := strings.Cut(pattern, " ")
		if !ok {
			t.Fatalf("route %q has no method: every route names one, so that reads and writes are told apart", pattern)
		}
		path = fill.Replace(path)
		for _, token := range []string{"", b.token} {
			for _, hdr := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Sec-Fetch-Site", "same-site"}, {"Origin", "https://evil.example"}, {"Origin", "null"}} {
				req, _ := http.NewRequest(method, b.srv.URL+path, strings.NewReader(`{"kind":"k","payload":{},"status":"DEAD","paused":true}`))
				req.Header.Set("Content-Type", "text/plain")
				req.Header.Set(hdr[0], hdr[1])
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				refused := resp.StatusCode == http.StatusForbidden
				if method == http.MethodGet && refused {
					t.Errorf("GET %s with %s: %s: 403 on a read", path, hdr[0], hdr[1])
				}
				if method != http.MethodGet && !refused {
					t.Errorf("%s %s with %s: %s (token %v): %d, want 403", method, path, hdr[0], hdr[1], token != "", resp.StatusCode)
				}
			}
		}
		if method != http.MethodGet {
			unsafe++
		}
	}
	if unsafe < 6 {
		t.Fatalf("only %d state-changing routes in %v", unsafe, h.Routes())
	}
	for path, empty := range map[string]string{"/v1/tasks": `"tasks":[]`, "/v1/kinds": `"kinds":[]`} {
		if r := b.do(t, "GET", path, ""); r.code != http.StatusOK || !strings.Contains(string(r.body), empty) {
			t.Fatalf("GET %s after refused requests: %d %s", path, r.code, r.body)
		}
	}
}
