package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCreateRequestBody: whatever the body of POST /v1/tasks holds, the
// strict decoding and the validation do not panic; they accept only a JSON
// object with a non-empty kind and a non-null payload, and refuse the rest
// with a 4xx naming the field. Run: go test -run='^$' -fuzz='^FuzzCreateRequestBody$' ./api
func FuzzCreateRequestBody(f *testing.F) {
	for _, s := range []string{
		`{"kind":"email","payload":{"to":"a@example.com"}}`,
		`{"kind":"email","payload":{"to":"a"},"idempotency_key":"k1","max_attempts":3}`,
		`{"kind":"","payload":1}`, `{"kind":"x","payload":null}`, `{"kind":"x"}`, `{"kind":"x","payload":1,"extra":true}`,
		`{"kind":"x","payload":1}{"kind":"y"}`, `{"kind":1,"payload":1}`, `{"kind":"x","payload":1,"max_attempts":0}`,
		`[]`, `null`, ``, `   `, `{"kind":"x","payload":"\u0000"}`, `{"kind":"x","payload":{"a":`, "\xff",
		`{"kind":"x","payload":1,"max_attempts":99999999999999999999}`,
	} {
		f.Add([]byte(s))
	}
	s := &Server{maxBytes: 1 << 16}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req CreateRequest
		ierr := decodeStrict(body, &req, "")
		if ierr == nil {
			nt, verr := s.newTask(req, "")
			if verr != nil {
				ierr = verr
			} else {
				if strings.TrimSpace(nt.Kind) == "" || len(nt.Payload) == 0 || string(nt.Payload) == "null" {
					t.Fatalf("accepted %q as kind %q payload %q", body, nt.Kind, nt.Payload)
				}
				if !json.Valid(nt.Payload) {
					t.Fatalf("accepted an invalid JSON payload %q", nt.Payload)
				}
				return
			}
		}
		code := ierr.code
		if code == 0 {
			code = http.StatusBadRequest
		}
		if code < 400 || code > 499 {
			t.Fatalf("refused %q with status %d, want 4xx", body, code)
		}
		if ierr.msg == "" {
			t.Fatalf("refused %q without a message", body)
		}
		if !utf8.ValidString(ierr.msg) && utf8.Valid(body) {
			t.Fatalf("message %q is not valid UTF-8", ierr.msg)
		}
	})
}
