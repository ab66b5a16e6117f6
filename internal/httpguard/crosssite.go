package httpguard

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/ingest-worker/ingest/internal/clip"
)

// CrossSiteError says why a request was refused as cross-site: Header is
// the request header that showed it (Sec-Fetch-Site or Origin).
type CrossSiteError struct {
	Header string
	Value  string
}

func (e *CrossSiteError) Error() string {
	return fmt.Sprintf("cross-origin request refused: %s is %q; a state-changing request must come from this server's own pages "+
		"or from a client that sends neither Origin nor Sec-Fetch-Site", e.Header, clipHeader(e.Value))
}

// Safe reports whether method changes nothing (GET, HEAD, OPTIONS).
func Safe(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}

// CrossSite returns why r is refused when it changes state and a browser
// sent it on behalf of another site; nil otherwise. A browser says where a
// request comes from in Sec-Fetch-Site, which no page can set: same-origin
// and none (the user's own navigation) pass, anything else is refused
// (same-site too: the API and the dashboard are one origin, a sibling
// subdomain is not it). A browser too old to send it is judged by Origin:
// present and not naming r's own host and port ("null" included), it is
// refused. Clients that send neither header pass. Origin is not compared
// when Sec-Fetch-Site says same-origin: a reverse proxy that rewrites Host
// (nginx's default) makes them differ for the dashboard's own forms. The
// scheme is not compared either: behind a proxy that ends TLS the server
// sees http while the browser says https, and one host:port serves one
// scheme.
func CrossSite(r *http.Request) *CrossSiteError {
	if Safe(r.Method) {
		return nil
	}
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "same-origin", "none":
		return nil
	case "":
	default:
		return &CrossSiteError{Header: "Sec-Fetch-Site", Value: site}
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	if !sameOrigin(origin, r.Host) {
		return &CrossSiteError{Header: "Origin", Value: origin}
	}
	return nil
}

// sameOrigin reports whether origin (scheme://host[:port]) names host, the
// request's Host header.
func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	return host != "" && strings.EqualFold(u.Host, host)
}

// clipHeader shortens a header value for a message.
func clipHeader(v string) string {
	const max = 200
	if len(v) > max {
		return clip.String(v, max) + "…"
	}
	return v
}
