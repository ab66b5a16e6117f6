package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// openAPI is the document api.OpenAPI returns, decoded.
func openAPI(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json is not JSON: %v", err)
	}
	return doc
}

// httpMethods are the keys of an OpenAPI path item that are operations.
var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// documentedRoutes returns "METHOD /path" for every operation of doc, in
// the form of the server's route patterns.
func documentedRoutes(t *testing.T, doc map[string]any) []string {
	t.Helper()
	paths, ok := doc["paths"].(map[string]any)
	if !ok {
		t.Fatal("openapi.json has no paths")
	}
	var out []string
	for path, item := range paths {
		for key := range item.(map[string]any) {
			if slices.Contains(httpMethods, key) {
				out = append(out, strings.ToUpper(key)+" "+path)
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestOpenAPIRoutes holds the document to the server's route table: every
// route New registers (with /metrics) is an operation of the document,
// and every operation of the document is a registered route.
func TestOpenAPIRoutes(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Token: "secret"}, store, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	registered := srv.Routes()
	slices.Sort(registered)
	documented := documentedRoutes(t, openAPI(t))
	for _, r := range registered {
		if !slices.Contains(documented, r) {
			t.Errorf("route %q is registered but not in api/openapi.json", r)
		}
	}
	for _, r := range documented {
		if !slices.Contains(registered, r) {
			t.Errorf("operation %q is in api/openapi.json but the server does not register it", r)
		}
	}
}

// pointer resolves a JSON pointer (RFC 6901, without escapes) in doc; a
// path segment "name=x" picks the element of an array whose "name" is x.
func pointer(t *testing.T, doc any, ptr string) any {
	t.Helper()
	cur := doc
	for _, seg := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[seg]
			if !ok {
				t.Fatalf("openapi.json: %s: no %q", ptr, seg)
			}
			cur = next
		case []any:
			name, ok := strings.CutPrefix(seg, "name=")
			if !ok {
				t.Fatalf("openapi.json: %s: %q does not pick an array element", ptr, seg)
			}
			i := slices.IndexFunc(v, func(e any) bool { m, _ := e.(map[string]any); return m["name"] == name })
			if i < 0 {
				t.Fatalf("openapi.json: %s: no element named %q", ptr, name)
			}
			cur = v[i]
		default:
			t.Fatalf("openapi.json: %s: %q below a leaf", ptr, seg)
		}
	}
	return cur
}

// TestOpenAPIFacts holds the document's bounds and enumerations to the
// code that owns them (package task), so the two cannot drift apart.
func TestOpenAPIFacts(t *testing.T) {
	t.Parallel()
	doc := openAPI(t)
	const schemas = "/components/schemas/"
	ranges := map[string]task.Range{
		schemas + "CreateRequest/properties/max_attempts":     task.MaxAttemptsRange,
		schemas + "CreateRequest/properties/delay_ms":         task.DelayRange,
		schemas + "CreateRequest/properties/timeout_ms":       task.TimeoutRange,
		"/paths/~1v1~1tasks/get/parameters/name=limit/schema": task.ListLimitRange,
		schemas + "BulkRedriveRequest/properties/limit":       task.RedriveLimitRange,
		schemas + "KindRequest/properties/concurrency":        task.ConcurrencyRange,
		schemas + "ProgressRequest/properties/attempt":        task.AttemptRange,
		schemas + "ProgressRequest/properties/percent":        task.ProgressPercentRange,
		schemas + "Progress/properties/percent":               task.ProgressPercentRange,
	}
	for ptr, r := range ranges {
		s := pointer(t, doc, ptr).(map[string]any)
		if s["minimum"] != float64(r.Min) || s["maximum"] != float64(r.Max) {
			t.Errorf("%s: minimum %v, maximum %v; package task's %s range is %s", ptr, s["minimum"], s["maximum"], r.Field, r.Text())
		}
	}
	lengths := map[string]int{
		schemas + "CreateRequest/properties/kind":            task.MaxKindLength,
		"/components/parameters/Kind/schema":                 task.MaxKindLength,
		schemas + "CreateRequest/properties/idempotency_key": task.MaxIdempotencyKeyLength,
		schemas + "CreateRequest/properties/group_key":       task.MaxGroupKeyLength,
		schemas + "CancelRequest/properties/reason":          task.MaxCancelReasonBytes,
		schemas + "ProgressRequest/properties/message":       task.MaxProgressMessageBytes,
		schemas + "Progress/properties/message":              task.MaxProgressMessageBytes,
	}
	for ptr, n := range lengths {
		if got := pointer(t, doc, ptr).(map[string]any)["maxLength"]; got != float64(n) {
			t.Errorf("%s: maxLength %v, want %d", ptr, got, n)
		}
	}
	enum := func(ptr string) []string {
		var out []string
		for _, v := range pointer(t, doc, ptr).(map[string]any)["enum"].([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	var states []string
	for _, s := range task.States {
		states = append(states, string(s))
	}
	if got := enum(schemas + "TaskStatus"); !slices.Equal(got, states) {
		t.Errorf("TaskStatus enum %v, want task.States %v", got, states)
	}
	if got, want := enum("/paths/~1v1~1tasks/get/parameters/name=status/schema"), append(slices.Clone(states), strings.ToLower(task.ScheduledFilter)); !slices.Equal(got, want) {
		t.Errorf("the status filter's enum %v, want %v", got, want)
	}
	if got, want := enum(schemas+"Task/properties/parked_reason"), []string{task.ParkedPaused, task.ParkedLimit}; !slices.Equal(got, want) {
		t.Errorf("parked_reason enum %v, want %v", got, want)
	}
	// A pattern cannot bound a duration: the description states MaxWait.
	wait := pointer(t, doc, "/paths/~1v1~1tasks~1{id}/get/parameters/name=wait").(map[string]any)["description"].(string)
	if bound := fmt.Sprintf("at most %gs", api.MaxWait.Seconds()); !strings.Contains(wait, bound) {
		t.Errorf("the wait parameter's description %q does not say %q (api.MaxWait)", wait, bound)
	}
}

// TestOpenAPIServed: GET /v1/openapi.json answers the document without
// a token, with its ETag, and 304 to a client that has it.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: "secret"})
	b.token = "" // the document needs none
	res := b.do(t, http.MethodGet, "/v1/openapi.json", "")
	if res.code != http.StatusOK || res.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/openapi.json: %d %q", res.code, res.header.Get("Content-Type"))
	}
	if !bytes.Equal(res.body, api.OpenAPI()) {
		t.Fatal("GET /v1/openapi.json does not answer the embedded document")
	}
	etag := res.header.Get("ETag")
	if etag == "" || res.header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("ETag %q, Cache-Control %q: want a validator and no-cache", etag, res.header.Get("Cache-Control"))
	}
	for _, inm := range []string{etag, `"other", ` + etag, "W/" + etag, "*"} {
		if res := b.do(t, http.MethodGet, "/v1/openapi.json", "", "If-None-Match", inm); res.code != http.StatusNotModified || len(res.body) != 0 {
			t.Errorf("If-None-Match %s: %d with %d bytes, want 304 and no body", inm, res.code, len(res.body))
		}
	}
	if res := b.do(t, http.MethodGet, "/v1/openapi.json", "", "If-None-Match", `"other"`); res.code != http.StatusOK {
		t.Errorf("If-None-Match of another document: %d, want 200", res.code)
	}
	// The other /v1 routes still require the token.
	if res := b.do(t, http.MethodGet, "/v1/kinds", ""); res.code != http.StatusUnauthorized {
		t.Errorf("GET /v1/kinds without a token: %d, want 401", res.code)
	}
}

// nodeEnv is the environment of the Node.js tools: no update notices, no
// telemetry.
func nodeEnv(extra ...string) []string {
	return append(append(os.Environ(), extra...),
		"REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "NO_UPDATE_NOTIFIER=1", "NO_COLOR=1")
}

// TestOpenAPILint runs redocly lint with redocly.yaml (the recommended
// rules, warnings as errors) on the document.
func TestOpenAPILint(t *testing.T) {
	t.Parallel()
	redocly := testenv.NodeBin(t, "redocly")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, redocly, "lint", "--config", "redocly.yaml", "openapi.json")
	cmd.Env = nodeEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redocly lint api/openapi.json: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "description is valid") {
		t.Fatalf("redocly lint printed no verdict:\n%s", out)
	}
}

// jsonFields returns the JSON names of t's fields (embedded structs'
// fields flattened, as encoding/json does) and, of each, whether the
// encoder always writes it (no omitempty).
func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			maps.Copy(out, jsonFields(f.Type))
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = !slices.Contains(strings.Split(opts, ","), "omitempty")
	}
	return out
}

// schemaFields returns the properties of a component schema (its allOf
// parts and their $refs merged) and, of each, whether it is required.
func schemaFields(t *testing.T, doc map[string]any, name string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	var walk func(s map[string]any)
	walk = func(s map[string]any) {
		if ref, ok := s["$ref"].(string); ok {
			walk(pointer(t, doc, strings.TrimPrefix(ref, "#")).(map[string]any))
			return
		}
		parts, _ := s["allOf"].([]any)
		for _, part := range parts {
			walk(part.(map[string]any))
		}
		props, _ := s["properties"].(map[string]any)
		for p := range props {
			out[p] = false
		}
		req, _ := s["required"].([]any)
		for _, p := range req {
			out[p.(string)] = true
		}
	}
	walk(pointer(t, doc, "/components/schemas/"+name).(map[string]any))
	return out
}

// TestOpenAPISchemas holds each body schema of the document to the Go type
// the server encodes or decodes: the same field names, and for an answer,
// a field the encoder always writes is required and an omitempty one is
// not (so a generated client types them as they come).
func TestOpenAPISchemas(t *testing.T) {
	t.Parallel()
	doc := openAPI(t)
	for _, c := range []struct {
		schema string
		typ    any
		answer bool
	}{
		{"CreateRequest", api.CreateRequest{}, false},
		{"BulkRedriveRequest", api.BulkRedriveRequest{}, false},
		{"CancelRequest", api.CancelRequest{}, false},
		{"RedriveRequest", api.RedriveRequest{}, false},
		{"DependencyEdge", task.Edge{}, true},
		{"KindRequest", api.KindRequest{}, false},
		{"ProgressRequest", api.ProgressRequest{}, false},
		{"CreateResponse", api.CreateResponse{}, true},
		{"BatchResponse", api.BatchResponse{}, true},
		{"ListResponse", api.ListResponse{}, true},
		{"Task", task.Task{}, true},
		{"TaskDetail", api.TaskResponse{}, true},
		{"Progress", task.Progress{}, true},
		{"Transition", transition.Record{}, true},
		{"RedriveResponse", api.RedriveResponse{}, true},
		{"BulkRedriveResponse", dlq.BulkRedriveResult{}, true},
		{"RunNowResponse", api.RunNowResponse{}, true},
		{"KindInfo", task.KindInfo{}, true},
		{"KindsResponse", api.KindsResponse{}, true},
		{"KindResponse", api.KindResponse{}, true},
		{"Slot", maintenance.Slot{}, true},
		{"PeriodicResponse", api.PeriodicResponse{}, true},
	} {
		goFields, docFields := jsonFields(reflect.TypeOf(c.typ)), schemaFields(t, doc, c.schema)
		for name, always := range goFields {
			required, ok := docFields[name]
			switch {
			case !ok:
				t.Errorf("%s: field %q of %T is not in the schema", c.schema, name, c.typ)
			case c.answer && always != required:
				t.Errorf("%s: %q is required=%v, but %T writes it always=%v", c.schema, name, required, c.typ, always)
			}
		}
		for name := range docFields {
			if _, ok := goFields[name]; !ok {
				t.Errorf("%s: property %q is not a field of %T", c.schema, name, c.typ)
			}
		}
	}
}
