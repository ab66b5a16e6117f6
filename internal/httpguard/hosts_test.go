package httpguard_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ingest-worker/ingest/internal/httpguard"
)

func TestParseHosts(t *testing.T) {
	t.Parallel()
	h, err := httpguard.ParseHosts([]string{" ingest.example.com", "", "10.0.0.5", "[fd00::1]", "metrics.example.com:9100", "Upper.Example."})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		// Always: the loopback names, any port.
		"localhost": true, "localhost:8080": true, "127.0.0.1:1": true, "[::1]:8080": true, "[::1]": true, "LOCALHOST.": true,
		// Listed names, any port, any case, with or without the root dot.
		"ingest.example.com": true, "ingest.example.com:8080": true, "INGEST.example.COM:80": true, "ingest.example.com.:8080": true,
		"upper.example": true, "10.0.0.5:8080": true, "[fd00::1]:8080": true, "[FD00:0::1]:8080": true,
		// A name with a port: that port only.
		"metrics.example.com:9100": true, "metrics.example.com:9101": false, "metrics.example.com": false,
		// Everything else.
		"": false, "rebind.evil.example": false, "rebind.evil.example:8080": false, "ingest.example.com.evil.example": false,
		"evil.ingest.example.com": false, "10.0.0.6": false, "127.0.0.2:8080": false, "localhost.evil.example": false,
	} {
		if got := h.Allows(host); got != want {
			t.Errorf("Allows(%q) = %v, want %v", host, got, want)
		}
	}
	any, err := httpguard.ParseHosts([]string{"*"})
	if err != nil || !any.Allows("rebind.evil.example:8080") || any.String() != "*" {
		t.Fatalf("*: %v, %v", any, err)
	}
	for _, bad := range []string{"https://ingest.example.com", "ingest.example.com/ui", "*.example.com", "host:0", "host:99999", "host:http",
		"a..b", "under score!", "1.2.3.4:5:6", "user@host"} {
		if _, err := httpguard.ParseHosts([]string{"ok.example", bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseHosts(%q) = %v, want an error naming the entry", bad, err)
		}
	}
}

func TestDefaultHosts(t *testing.T) {
	t.Parallel()
	h, err := httpguard.DefaultHosts("127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	if !h.Allows("127.0.0.1:8080") || !h.Allows("localhost:8080") || h.Allows("rebind.evil.example:8080") {
		t.Fatalf("127.0.0.1:8080: %s", h)
	}
	h, err = httpguard.DefaultHosts("ingest.internal:8080")
	if err != nil || !h.Allows("ingest.internal:8080") || h.Allows("other.internal:8080") {
		t.Fatalf("ingest.internal:8080: %s, %v", h, err)
	}
	// Every interface: the machine's addresses (a Prometheus or a kubelet
	// that reaches it by IP) and host name.
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, listen := range []string{"0.0.0.0:8080", ":8080", "[::]:8080"} {
		h, err := httpguard.DefaultHosts(listen)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !h.Allows(net.JoinHostPort(n.IP.String(), "8080")) {
				t.Errorf("%s: the machine's address %s is refused (%s)", listen, n.IP, h)
			}
		}
		if h.Allows("rebind.evil.example:8080") {
			t.Errorf("%s allows rebind.evil.example", listen)
		}
	}
	if _, err := httpguard.DefaultHosts("8080"); err == nil {
		t.Fatal("DefaultHosts(8080): no error")
	}
}

// TestForListen: listed names add to what the server always answers to:
// the loopback names and the listen address's host, or listening on every
// interface the machine's addresses.
func TestForListen(t *testing.T) {
	t.Parallel()
	h, err := httpguard.ForListen("ingest.internal:8080", []string{"worker", " "})
	if err != nil || !h.Allows("worker:8080") || !h.Allows("ingest.internal:8080") || !h.Allows("localhost:8080") || h.Allows("other.internal") {
		t.Fatalf("listed: %s, %v", h, err)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	h, err = httpguard.ForListen("0.0.0.0:8080", []string{"worker"})
	if err != nil || !h.Allows("worker:8080") || h.Allows("0.0.0.0:8080") || h.Allows("rebind.evil.example") {
		t.Fatalf("listed, every interface: %s, %v", h, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !h.Allows(net.JoinHostPort(n.IP.String(), "8080")) {
			t.Errorf("listed, every interface: the machine's address %s is refused (%s)", n.IP, h)
		}
	}
	h, err = httpguard.ForListen("10.9.8.7:8080", []string{"", " "})
	if err != nil || !h.Allows("10.9.8.7:8080") || h.Allows("worker:8080") {
		t.Fatalf("empty: %s, %v", h, err)
	}
	h, err = httpguard.ForListen("10.9.8.7:8080", []string{"*"})
	if err != nil || !h.Allows("rebind.evil.example") || h.String() != "*" {
		t.Fatalf("*: %s, %v", h, err)
	}
	if _, err := httpguard.ForListen("127.0.0.1:8080", []string{"https://x/"}); err == nil {
		t.Fatal("a URL entry: no error")
	}
}

// TestHostsHandler: a refused Host gets 421 in plain text naming the
// setting, and next never sees the request.
func TestHostsHandler(t *testing.T) {
	t.Parallel()
	h, err := httpguard.ParseHosts(nil)
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int32
	srv := httptest.NewServer(h.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }), nil))
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/tasks", nil)
	req.Host = "rebind.evil.example:8080"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") ||
		!strings.Contains(string(body), httpguard.Setting) || !strings.Contains(string(body), `"rebind.evil.example:8080"`) || served.Load() != 0 {
		t.Fatalf("%d %q %s (served %d)", resp.StatusCode, resp.Header.Get("Content-Type"), body, served.Load())
	}
	resp, err = http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || served.Load() != 1 {
		t.Fatalf("127.0.0.1: %d (served %d)", resp.StatusCode, served.Load())
	}
}
