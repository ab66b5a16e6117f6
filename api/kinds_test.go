package api_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/task"
)

// TestKinds: PUT /v1/kinds/{kind} pauses and resumes a kind (recorded with
// the server's actor) and sets and removes its limits, GET /v1/kinds lists
// kinds with their settings and tasks by status; bad bodies are 400s
// naming the field.
func TestKinds(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	for range 3 {
		if _, err := b.store.Create(ctx, task.NewTask{Kind: "embed", Payload: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	r := b.do(t, "PUT", "/v1/kinds/embed", `{"paused":true}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || !k.Paused || k.Kind != "embed" || k.Counts[task.Queued] != 3 || k.UpdatedBy != "api" {
		t.Fatalf("pause: %d %s", r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/kinds", "")
	if l := decode[api.KindsResponse](t, r); r.code != http.StatusOK || len(l.Kinds) != 1 || !l.Kinds[0].Paused {
		t.Fatalf("list: %d %s", r.code, r.body)
	}
	r = b.do(t, "PUT", "/v1/kinds/embed", `{"paused":false}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || k.Paused || k.Released != 0 {
		t.Fatalf("resume: %d %s", r.code, r.body)
	}
	r = b.do(t, "PUT", "/v1/kinds/embed", `{"concurrency":4,"rate":"300/m"}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || k.Paused || k.Concurrency != 4 || k.Rate != "300/m" {
		t.Fatalf("limit: %d %s", r.code, r.body)
	}
	r = b.do(t, "PUT", "/v1/kinds/embed", `{"rate":"0"}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || k.Concurrency != 4 || k.Rate != "0" {
		t.Fatalf("remove the rate limit: %d %s", r.code, r.body)
	}
	r = b.do(t, "PUT", "/v1/kinds/embed", `{"concurrency_per_group":2,"rate_per_group":"5/s","group_window":50}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || k.Concurrency != 4 || k.ConcurrencyPerGroup != 2 || k.RatePerGroup != "5/s" || k.GroupWindow != 50 {
		t.Fatalf("per-group limits: %d %s", r.code, r.body)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"concurrency_per_group":-1}`, "concurrency_per_group"},
		{`{"rate_per_group":"5/fortnight"}`, "rate_per_group"},
		{`{"rate_per_group":"100000/s"}`, "rate_per_group"},
		{`{"group_window":-3}`, "group_window"},
		{`{"concurrency":-1}`, "concurrency"},
		{`{"concurrency":"4"}`, "concurrency"},
		{`{"rate":"5/fortnight"}`, "rate"},
		{`{"rate":"five/s"}`, "rate"},
		{`{"rate":"100000/s"}`, "rate"},
		{`{}`, "paused"},
		{`{"paused":"yes"}`, "paused"},
		{`{"paused":true,"bogus":1}`, "bogus"},
		{`{"group_weights":{"a":0}}`, "group_weights"},
		{`{"group_weights":{"a":101}}`, "group_weights"},
		{`{"group_weights":{"a":1.5}}`, "group_weights"},
		{`{"group_weights":{"a":"3"}}`, "group_weights"},
		{`{"group_weights":{"a":1e30}}`, "group_weights"},
		{`{"group_weights":{"":2}}`, "group_weights"},
		{`{"group_weights":{"` + strings.Repeat("x", task.MaxGroupKeyLength+1) + `":2}}`, "group_weights"},
		{`{"group_weights":[3]}`, "group_weights"},
	} {
		r := b.do(t, "PUT", "/v1/kinds/embed", tc.body)
		if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != tc.field {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.body, r.code, r.body, tc.field)
		}
	}
	if r := b.do(t, "PUT", "/v1/kinds/%20", `{"paused":true}`); r.code != http.StatusBadRequest {
		t.Errorf("a blank kind: %d %s, want 400", r.code, r.body)
	}
}

// TestKindGroupWeights: PUT /v1/kinds/{kind} sets group weights (merged
// into the kind's, 1 removing one), GET /v1/kinds/{kind} and GET
// /v1/kinds show them; an unknown kind is a 404.
func TestKindGroupWeights(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "PUT", "/v1/kinds/embed", `{"group_weights":{"tenant-a":3,"tenant-b":2}}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || len(k.GroupWeights) != 2 || k.GroupWeights["tenant-a"] != 3 {
		t.Fatalf("set weights: %d %s", r.code, r.body)
	}
	r = b.do(t, "PUT", "/v1/kinds/embed", `{"group_weights":{"tenant-b":1}}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || len(k.GroupWeights) != 1 || k.GroupWeights["tenant-a"] != 3 {
		t.Fatalf("reset one weight: %d %s", r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/kinds/embed", "")
	if k := decode[task.KindInfo](t, r); r.code != http.StatusOK || k.Kind != "embed" || len(k.GroupWeights) != 1 || k.GroupWeights["tenant-a"] != 3 {
		t.Fatalf("get the kind: %d %s", r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/kinds", "")
	if l := decode[api.KindsResponse](t, r); r.code != http.StatusOK || len(l.Kinds) != 1 || l.Kinds[0].GroupWeights["tenant-a"] != 3 {
		t.Fatalf("list: %d %s", r.code, r.body)
	}
	if r := b.do(t, "GET", "/v1/kinds/nothing", ""); r.code != http.StatusNotFound {
		t.Errorf("an unknown kind: %d %s, want 404", r.code, r.body)
	}
	if r := b.do(t, "PUT", "/v1/kinds/plain", `{"paused":false}`); r.code != http.StatusOK || !strings.Contains(string(r.body), `"group_weights":{}`) {
		t.Errorf("a kind without weights: %d %s, want group_weights {}", r.code, r.body)
	}
}

// TestParkedTasks: GET /v1/tasks/{id} and the list say why a parked task
// waits (parked_reason "paused", parked_at) and show no far-future time.
func TestParkedTasks(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	c, err := b.store.Create(ctx, task.NewTask{Kind: "embed", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if r := b.do(t, "PUT", "/v1/kinds/embed", `{"paused":true}`); r.code != http.StatusOK {
		t.Fatalf("pause: %d %s", r.code, r.body)
	}
	if parked, err := b.store.Park(ctx, c.Task.ID); err != nil || len(parked) != 1 {
		t.Fatalf("Park = %v, %v", parked, err)
	}
	r := b.do(t, "GET", "/v1/tasks/"+c.Task.ID.String(), "")
	got := decode[api.TaskResponse](t, r)
	if r.code != http.StatusOK || got.ParkedAt == nil || got.ParkedReason != task.ParkedPaused || got.NextRetryAt != nil ||
		!strings.Contains(string(r.body), `"parked_reason":"paused"`) || strings.Contains(string(r.body), "9999") {
		t.Fatalf("get of a parked task: %d %s", r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/tasks?kind=embed", "")
	if l := decode[api.ListResponse](t, r); r.code != http.StatusOK || len(l.Tasks) != 1 || l.Tasks[0].ParkedReason != task.ParkedPaused {
		t.Fatalf("list of a parked task: %d %s", r.code, r.body)
	}
	if r := b.do(t, "PUT", "/v1/kinds/embed", `{"paused":false}`); r.code != http.StatusOK {
		t.Fatalf("resume: %d %s", r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/tasks/"+c.Task.ID.String(), "")
	if strings.Contains(string(r.body), "parked") {
		t.Fatalf("get after the resume: %s; want no parked fields", r.body)
	}
}

// TestScheduleHorizon: a run_at or delay_ms beyond the scheduling horizon
// is a 400 naming the field and the horizon; a delay_ms of the horizon is
// accepted.
func TestScheduleHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	horizonMS := task.ScheduleHorizon.Milliseconds()
	for _, tc := range []struct{ body, field, msg string }{
		{`{"kind":"k","payload":1,"run_at":"9999-12-31T00:00:00Z"}`, "run_at", "scheduling horizon"},
		{`{"kind":"k","payload":1,"run_at":"` + time.Now().Add(task.ScheduleHorizon+time.Hour).UTC().Format(time.RFC3339) + `"}`, "run_at", "3653 days"},
		{`{"kind":"k","payload":1,"delay_ms":` + strconv.FormatInt(horizonMS+1, 10) + `}`, "delay_ms", strconv.FormatInt(horizonMS, 10)},
	} {
		r := b.do(t, "POST", "/v1/tasks", tc.body)
		if msg, field := r.errorBody(t); r.code != http.StatusBadRequest || field != tc.field || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %d %s, want 400 naming %s and %q", tc.body, r.code, r.body, tc.field, tc.msg)
		}
	}
	if r := b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":1,"delay_ms":`+strconv.FormatInt(horizonMS, 10)+`}`); r.code != http.StatusCreated {
		t.Errorf("a delay_ms of the horizon: %d %s, want 201", r.code, r.body)
	}
}
