package httpguard_test

import (
	"net/http/httptest"
	"testing"

	"github.com/ingest-worker/ingest/internal/httpguard"
)

func TestCrossSite(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, method, host string
		headers            map[string]string
		refused            string // the header named, "" when allowed
	}{
		{"CurlPost", "POST", "127.0.0.1:8080", nil, ""},
		{"SameOriginFetch", "POST", "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:8080"}, ""},
		{"UserNavigation", "POST", "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "none"}, ""},
		{"OriginOnlySame", "PUT", "ingest.example.com", map[string]string{"Origin": "https://ingest.example.com"}, ""},
		{"OriginCaseAndScheme", "POST", "Ingest.Example.com:8443", map[string]string{"Origin": "https://ingest.example.com:8443"}, ""},
		{"CrossSiteRead", "GET", "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, ""},
		{"CrossSiteHead", "HEAD", "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site"}, ""},
		{"CrossSite", "POST", "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"},
		{"SameSite", "POST", "a.example.com", map[string]string{"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site"},
		{"UnknownSite", "DELETE", "a.example.com", map[string]string{"Sec-Fetch-Site": "whatever"}, "Sec-Fetch-Site"},
		{"ForeignOrigin", "POST", "127.0.0.1:8080", map[string]string{"Origin": "https://evil.example"}, "Origin"},
		// The browser says same-origin; a proxy rewrote Host to its upstream.
		{"ProxyRewroteHost", "POST", "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "https://dashboard.example.com"}, ""},
		{"CrossSiteWithOwnOrigin", "POST", "127.0.0.1:8080", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1:8080"}, "Sec-Fetch-Site"},
		{"OtherPort", "POST", "127.0.0.1:8080", map[string]string{"Origin": "http://127.0.0.1:9090"}, "Origin"},
		{"NullOrigin", "POST", "127.0.0.1:8080", map[string]string{"Origin": "null"}, "Origin"},
		{"OriginWithPath", "POST", "127.0.0.1:8080", map[string]string{"Origin": "http://127.0.0.1:8080/x"}, "Origin"},
		{"OriginNotHTTP", "PATCH", "127.0.0.1:8080", map[string]string{"Origin": "ftp://127.0.0.1:8080"}, "Origin"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.method, "http://"+tt.host+"/v1/tasks", nil)
			r.Host = tt.host
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			cs := httpguard.CrossSite(r)
			switch {
			case tt.refused == "" && cs != nil:
				t.Fatalf("refused: %v", cs)
			case tt.refused != "" && cs == nil:
				t.Fatal("allowed")
			case cs != nil && cs.Header != tt.refused:
				t.Fatalf("refused for %s, want %s: %v", cs.Header, tt.refused, cs)
			}
		})
	}
}
