package api_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/ingest-worker/ingest/api"
)

// TestTraceparentHeaderIsKept: with tracing off (no provider in this test
// binary) the traceparent header of POST /v1/tasks and :batch is kept
// with the tasks as it came, and the task API shows it; without the
// header, or with a malformed one, the task has none.
func TestTraceparentHeaderIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	r := b.do(t, "POST", "/v1/tasks", `{"kind":"a","payload":1}`, "traceparent", tp)
	if r.code != http.StatusCreated {
		t.Fatalf("%d %s", r.code, r.body)
	}
	one := decode[api.CreateResponse](t, r)
	r = b.do(t, "POST", "/v1/tasks:batch", `[{"kind":"a","payload":2},{"kind":"b","payload":3}]`, "traceparent", tp)
	if r.code != http.StatusCreated {
		t.Fatalf("%d %s", r.code, r.body)
	}
	batch := decode[api.BatchResponse](t, r)
	ids := []api.CreateResponse{one, batch.Tasks[0], batch.Tasks[1]}
	for _, c := range ids {
		tk, err := b.store.Get(ctx, c.ID)
		if err != nil || tk.Traceparent != tp {
			t.Errorf("task %s: traceparent %q, %v; want %q", c.ID, tk.Traceparent, err, tp)
		}
	}
	got := b.do(t, "GET", "/v1/tasks/"+one.ID.String(), "")
	if task := decode[map[string]any](t, got); task["traceparent"] != tp {
		t.Errorf("GET /v1/tasks/{id}: traceparent %v, want %q", task["traceparent"], tp)
	}

	for _, header := range [][]string{nil, {"traceparent", "00-junk"}} {
		r := b.do(t, "POST", "/v1/tasks", `{"kind":"c","payload":1}`, header...)
		if r.code != http.StatusCreated {
			t.Fatalf("%v: %d %s", header, r.code, r.body)
		}
		tk, err := b.store.Get(ctx, decode[api.CreateResponse](t, r).ID)
		if err != nil || tk.Traceparent != "" {
			t.Errorf("created with header %v: traceparent %q, %v; want none", header, tk.Traceparent, err)
		}
	}
}
