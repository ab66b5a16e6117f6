package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/task"
)

// TestNumbersAreRangeChecked: every whole-number field of a body is
// checked against its range and refused with a 400 naming the field and
// the range; none is narrowed (max_attempts 4294967297 was stored as 1,
// 2147483648 answered 500) or rounded (1.5, 1e2, 1e400).
func TestNumbersAreRangeChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, tc := range []struct{ path, body, field, msg string }{
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":4294967297}`, "max_attempts", "from 1 to 1000000, got 4294967297"},
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":2147483648}`, "max_attempts", "from 1 to 1000000, got 2147483648"},
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":1000001}`, "max_attempts", "from 1 to 1000000"},
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":-1}`, "max_attempts", "from 1 to 1000000"},
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":99999999999999999999}`, "max_attempts", "from 1 to 1000000"},
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":1e400}`, "max_attempts", "from 1 to 1000000, got number 1e400"},
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":1.5}`, "max_attempts", "whole number"},
		{"/v1/tasks", `{"kind":"k","payload":1,"max_attempts":1e2}`, "max_attempts", "whole number"},
		{"/v1/tasks", `{"kind":"k","payload":1,"timeout_ms":2147483648}`, "timeout_ms", "from 0 to 2147483647"},
		{"/v1/tasks", `{"kind":"k","payload":1,"delay_ms":-1}`, "delay_ms", "from 0 to 315619200000"},
		{"/v1/tasks:batch", `[{"kind":"k","payload":1},{"kind":"k","payload":1,"max_attempts":4294967297}]`, "[1].max_attempts", "from 1 to 1000000"},
		{"/v1/tasks/redrive", `{"status":"DEAD","limit":1000001}`, "limit", "from 1 to 1000000"},
		{"/v1/tasks/redrive", `{"status":"DEAD","limit":1e400}`, "limit", "from 1 to 1000000"},
	} {
		r := b.do(t, "POST", tc.path, tc.body)
		if msg, field := r.errorBody(t); r.code != http.StatusBadRequest || field != tc.field || !strings.Contains(msg, tc.msg) {
			t.Errorf("POST %s %s: %d %s, want 400 naming %s and %q", tc.path, tc.body, r.code, r.body, tc.field, tc.msg)
		}
	}
	for _, body := range []string{`{"concurrency":100001}`, `{"concurrency":4294967297}`, `{"concurrency":1e400}`} {
		r := b.do(t, "PUT", "/v1/kinds/k", body)
		if msg, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "concurrency" || !strings.Contains(msg, "from 0 to 100000") {
			t.Errorf("PUT /v1/kinds/k %s: %d %s, want 400 naming concurrency and its range", body, r.code, r.body)
		}
	}
	for _, q := range []string{"limit=1001", "limit=1e3", "limit=99999999999999999999"} {
		r := b.do(t, "GET", "/v1/tasks?"+q, "")
		if msg, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "limit" || !strings.Contains(msg, "from 1 to 1000") {
			t.Errorf("GET /v1/tasks?%s: %d %s, want 400 naming limit and its range", q, r.code, r.body)
		}
	}
	tasks, _, err := b.store.List(context.Background(), task.ListParams{})
	if err != nil || len(tasks) != 0 {
		t.Fatalf("refused requests created %d tasks (%v)", len(tasks), err)
	}
	r := b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":1,"max_attempts":1000000}`)
	if r.code != http.StatusCreated {
		t.Fatalf("max_attempts 1000000: %d %s, want 201", r.code, r.body)
	}
}

// TestNamesAndFiltersRefuseBadCharacters: a kind or an idempotency key
// with a control or bidirectional character is refused at create with a
// 400 naming the field, as is such a kind in PUT /v1/kinds/{kind}; a NUL
// or bytes that are not UTF-8 in any filter, body field or body answer
// 400 (they were 500s from PostgreSQL), naming the field where there is
// one.
func TestNamesAndFiltersRefuseBadCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, tc := range []struct{ method, path, body, field string }{
		{"POST", "/v1/tasks", `{"kind":"esc\u001b[2J\u001b]0;pwned\u0007","payload":{}}`, "kind"},
		{"POST", "/v1/tasks", `{"kind":"abc\u202edef","payload":{}}`, "kind"},
		{"POST", "/v1/tasks", `{"kind":"two\nlines","payload":{}}`, "kind"},
		{"POST", "/v1/tasks", `{"kind":"nul\u0000","payload":{}}`, "kind"},
		{"POST", "/v1/tasks", `{"kind":"k","payload":{},"idempotency_key":"key\u2067"}`, "idempotency_key"},
		{"POST", "/v1/tasks", `{"kind":"k","payload":{},"idempotency_key":"key\u0085"}`, "idempotency_key"},
		{"POST", "/v1/tasks:batch", `[{"kind":"k\u001b","payload":{}}]`, "[0].kind"},
		{"POST", "/v1/tasks", "{\"kind\":\"k\xff\",\"payload\":{}}", ""},
		{"POST", "/v1/tasks", "{\"kind\":\"k\",\"payload\":\"\xc3\"}", ""},
		{"PUT", "/v1/kinds/esc%1B%5B2J", `{"paused":true}`, "kind"},
		{"PUT", "/v1/kinds/abc%E2%80%AEdef", `{"paused":true}`, "kind"},
		{"PUT", "/v1/kinds/nul%00", `{"paused":true}`, "kind"},
		{"PUT", "/v1/kinds/bad%FF", `{"paused":true}`, "kind"},
		{"GET", "/v1/tasks?kind=%00", "", "kind"},
		{"GET", "/v1/tasks?kind=a%00b", "", "kind"},
		{"GET", "/v1/tasks?kind=%FF", "", "kind"},
		{"POST", "/v1/tasks/redrive", `{"status":"DEAD","kind":"a\u0000"}`, "kind"},
		{"POST", "/v1/tasks/redrive", `{"status":"DEAD","error_contains":"a\u0000"}`, "error_contains"},
		{"POST", "/v1/tasks/redrive", "{\"status\":\"DEAD\",\"kind\":\"\xff\"}", ""},
	} {
		r := b.do(t, tc.method, tc.path, tc.body)
		if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != tc.field {
			t.Errorf("%s %s %q: %d %s, want 400 naming %q", tc.method, tc.path, tc.body, r.code, r.body, tc.field)
		}
	}
	id := b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":{}}`)
	if id.code != http.StatusCreated {
		t.Fatalf("create: %d %s", id.code, id.body)
	}
	created := decode[struct{ ID string }](t, id)
	r := b.do(t, "POST", "/v1/tasks/"+created.ID+"/cancel", `{"reason":"why\u0000"}`)
	if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "reason" {
		t.Errorf("cancel with a NUL in the reason: %d %s, want 400 naming reason", r.code, r.body)
	}
	tasks, _, err := b.store.List(context.Background(), task.ListParams{})
	if err != nil || len(tasks) != 1 || tasks[0].Status != task.Queued {
		t.Fatalf("after the refused requests: %+v (%v), want the one QUEUED task", tasks, err)
	}
}

// TestJSONBodiesEscapeControls: a string holding a bidirectional or C1
// control (a kind stored before names were checked) is answered with the
// character as a \u escape, so a body printed on a terminal cannot
// reorder or drive it; it decodes to the string as stored.
func TestJSONBodiesEscapeControls(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":{"note":"x\u202ey\u009bz\u007f"}}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	created := decode[struct{ ID string }](t, r)
	r = b.do(t, "GET", "/v1/tasks/"+created.ID, "")
	for _, raw := range []string{"\u202e", "\u009b", "\x7f"} {
		if strings.Contains(string(r.body), raw) {
			t.Fatalf("GET /v1/tasks/{id} holds %q as it is: %s", raw, r.body)
		}
	}
	got := decode[struct{ Payload struct{ Note string } }](t, r)
	if got.Payload.Note != "x\u202ey\u009bz\x7f" {
		t.Fatalf("payload note %q, want the string as stored", got.Payload.Note)
	}
}
