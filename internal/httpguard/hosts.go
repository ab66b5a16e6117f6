package httpguard

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ingest-worker/ingest/internal/clip"
)

// Setting is the configuration variable that holds the allow-list; a
// refusal names it.
const Setting = "INGEST_HTTP_ALLOWED_HOSTS"

// LoopbackNames are allowed on every port whatever the list says: a
// browser sends them only when it was asked for this machine itself, and
// no attacker can point them at another address.
var LoopbackNames = []string{"localhost", "127.0.0.1", "::1"}

// Hosts is an allow-list of the names and addresses an HTTP server answers
// to in the Host header. Build it with ForListen, DefaultHosts or ParseHosts.
type Hosts struct {
	any   bool
	names map[string]bool // canonical host: allowed on any port
	ports map[string]bool // canonical host ":" port: allowed on that port
	shown []string        // the entries, for String

	mu     sync.Mutex
	logged map[string]bool // refused hosts already logged
}

// maxLogged bounds how many distinct refused hosts are logged.
const maxLogged = 64

func newHosts() *Hosts {
	h := &Hosts{names: map[string]bool{}, ports: map[string]bool{}, logged: map[string]bool{}}
	for _, n := range LoopbackNames {
		h.names[n] = true
	}
	return h
}

// ParseHosts returns the allow-list of entries (the comma-separated
// parts of the setting; empty parts are skipped) plus LoopbackNames. An
// entry is "*" (any Host), a host name or an address ("ingest.example.com",
// "10.0.0.5", "[fd00::1]"), allowed on any port, or either with a port
// ("10.0.0.5:8080"), allowed on that port only. Names are compared without
// case and without a trailing dot. A URL, a path or a wildcard inside a
// name is an error.
func ParseHosts(entries []string) (*Hosts, error) {
	h := newHosts()
	if err := h.parse(entries); err != nil {
		return nil, err
	}
	return h, nil
}

// parse adds entries (see ParseHosts) to h.
func (h *Hosts) parse(entries []string) error {
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if e == "*" {
			h.any = true
			continue
		}
		host, port, err := parseEntry(e)
		if err != nil {
			return err
		}
		h.add(host, port)
	}
	return nil
}

// ForListen is the allow-list of a server listening on listenAddr
// (host:port): DefaultHosts, plus the entries (ParseHosts). What a server
// always answers to stays allowed when names are listed: the loopback
// names, the listen address's host (the healthcheck command connects to
// it) or, listening on every interface, the machine's name and addresses
// (a kubelet's probes and a Prometheus that scrapes pods by IP send them).
func ForListen(listenAddr string, entries []string) (*Hosts, error) {
	h, err := DefaultHosts(listenAddr)
	if err != nil {
		return nil, err
	}
	if err := h.parse(entries); err != nil {
		return nil, err
	}
	return h, nil
}

// DefaultHosts is the allow-list of a server listening on listenAddr
// (host:port) when no names are configured: LoopbackNames and the listen
// address's host. When that host is unspecified (":8080", "0.0.0.0:8080",
// "[::]:8080": every interface), the machine's host name (and its first
// label) and the addresses of its interfaces instead, as they are when
// DefaultHosts runs. Any other name a client uses (a DNS alias, a load
// balancer's, a compose service's) must be listed (ForListen). IP
// addresses of the machine are safe to allow: DNS rebinding needs a name
// the attacker controls.
func DefaultHosts(listenAddr string) (*Hosts, error) {
	host, _, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q is not host:port", listenAddr)
	}
	h := newHosts()
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		h.add(canonical(host), "")
		return h, nil
	}
	if name, err := os.Hostname(); err == nil && validName(canonical(name)) {
		name = canonical(name)
		h.add(name, "")
		if first, _, ok := strings.Cut(name, "."); ok && first != "" {
			h.add(first, "")
		}
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				h.add(n.IP.String(), "")
			}
		}
	}
	return h, nil
}

func (h *Hosts) add(host, port string) {
	if port == "" {
		if !h.names[host] {
			h.names[host] = true
			h.shown = append(h.shown, hostForm(host))
		}
		return
	}
	hp := host + ":" + port
	if !h.ports[hp] {
		h.ports[hp] = true
		h.shown = append(h.shown, net.JoinHostPort(host, port))
	}
}

// hostForm is host as it appears in a Host header (IPv6 in brackets).
func hostForm(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}

// parseEntry splits and checks one entry of the setting.
func parseEntry(e string) (host, port string, err error) {
	if strings.ContainsAny(e, "/?#@") {
		return "", "", fmt.Errorf("entry %q: want a host name or address, optionally with :port, not a URL", e)
	}
	if h, p, err := net.SplitHostPort(e); err == nil {
		host, port = h, p
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
			return "", "", fmt.Errorf("entry %q: the port must be a number from 1 to 65535", e)
		}
	} else if ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(e, "["), "]")); ip != nil {
		host = e
	} else if strings.Contains(e, ":") {
		return "", "", fmt.Errorf("entry %q is not host or host:port", e)
	} else {
		host = e
	}
	host = canonical(host)
	if !validName(host) {
		return "", "", fmt.Errorf("entry %q: %q is not a host name or an IP address (\"*\" alone allows any host; no other wildcard)", e, host)
	}
	return host, port, nil
}

// canonical is host lower-cased, without IPv6 brackets and a trailing
// dot; an IP address in its standard form.
func canonical(host string) string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip := net.ParseIP(host); ip != nil {
		return ip.String()
	}
	return host
}

// validName reports whether host (canonical) is an IP address or a DNS
// name: letters, digits, '-', '_' and dots between non-empty labels.
func validName(host string) bool {
	if host == "" || len(host) > 253 {
		return false
	}
	if net.ParseIP(host) != nil {
		return true
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// Allows reports whether a request with this Host header is answered.
func (h *Hosts) Allows(hostHeader string) bool {
	if h.any {
		return true
	}
	host, port := hostHeader, ""
	if hh, p, err := net.SplitHostPort(hostHeader); err == nil {
		host, port = hh, p
	}
	host = canonical(host)
	if host == "" {
		return false
	}
	return h.names[host] || (port != "" && h.ports[host+":"+port])
}

// String lists the allowed hosts, loopback names first.
func (h *Hosts) String() string {
	if h.any {
		return "*"
	}
	out := []string{"localhost", "127.0.0.1", "[::1]"}
	for _, s := range h.shown {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}

// Handler passes the requests whose Host is allowed to next and answers
// every other one 421 Misdirected Request in plain text, saying which
// setting to change, before next sees it. log (nil: none) gets a warning
// the first time a host is refused.
func (h *Hosts) Handler(next http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.Allows(r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		host := clip.String(r.Host, 200)
		if log != nil && h.firstRefusal(host) {
			log.WarnContext(r.Context(), "HTTP request refused: its Host is not allowed (DNS rebinding, or a name the server was not told about); "+
				"if this server should answer to it, add it to "+Setting, "host", host, "remote", r.RemoteAddr, "path", clip.String(r.URL.Path, 200))
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusMisdirectedRequest)
		fmt.Fprintf(w, "Host %q is not allowed on this server. If it should answer to that name or address "+
			"(a browser's URL, a Prometheus scrape target, a load balancer's host), add it to %s: "+
			"a comma-separated list of host names or addresses (host:port for one port only; * allows any host); "+
			"localhost, 127.0.0.1 and [::1] are always allowed.\n", host, Setting)
	})
}

// firstRefusal reports whether host is refused for the first time (of
// the first maxLogged hosts).
func (h *Hosts) firstRefusal(host string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.logged[host] || len(h.logged) >= maxLogged {
		return false
	}
	h.logged[host] = true
	return true
}
