package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/opsmetrics"
	"github.com/ingest-worker/ingest/task"
)

// TestDeleteTask: DELETE /v1/tasks/{id} answers 204 for a terminal task and
// removes it with its audit rows, outbox rows and DLQ entry, and counts it;
// 409 for a live task, which is kept; 404 for an unknown one (and for a
// task deleted already); 400 naming id for a bad one.
func TestDeleteTask(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, options{dlq: true, registerer: reg})
	dead, other := b.kill(t, "one", "boom"), b.kill(t, "one", "boom")
	r := b.do(t, "DELETE", "/v1/tasks/"+dead.String(), "")
	if r.code != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("delete DEAD: %d %s, want 204 and no body", r.code, r.body)
	}
	if r := b.do(t, "GET", "/v1/tasks/"+dead.String(), ""); r.code != http.StatusNotFound {
		t.Fatalf("GET a deleted task: %d, want 404", r.code)
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("DLQ depth %d after deleting one of two DEAD tasks, want 1", n)
	}
	if r := b.do(t, "GET", "/v1/tasks/"+other.String(), ""); r.code != http.StatusOK {
		t.Fatalf("the other DEAD task: %d, want 200", r.code)
	}
	if n := counterValue(t, reg, opsmetrics.DeletedName, "via", "api"); n != 1 {
		t.Fatalf("%s{via=api} = %v, want 1", opsmetrics.DeletedName, n)
	}

	c, err := b.store.Create(t.Context(), task.NewTask{Kind: "one", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	r = b.do(t, "DELETE", "/v1/tasks/"+c.Task.ID.String(), "")
	if msg, field := r.errorBody(t); r.code != http.StatusConflict || field != "id" || !strings.Contains(msg, "QUEUED") {
		t.Fatalf("delete QUEUED: %d %q field %q, want 409 naming the state and id", r.code, msg, field)
	}
	if r := b.do(t, "GET", "/v1/tasks/"+c.Task.ID.String(), ""); r.code != http.StatusOK {
		t.Fatalf("the refused task: %d, want 200 (kept)", r.code)
	}
	for _, id := range []string{dead.String(), uuid.NewString()} {
		if r := b.do(t, "DELETE", "/v1/tasks/"+id, ""); r.code != http.StatusNotFound {
			t.Fatalf("delete %s: %d, want 404", id, r.code)
		}
	}
	r = b.do(t, "DELETE", "/v1/tasks/not-a-uuid", "")
	if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "id" {
		t.Fatalf("delete bad id: %d field %q, want 400 id", r.code, field)
	}
}

// TestRunTaskNow: POST /v1/tasks/{id}/run makes a task delayed until later
// due now (200); a task already due, or a running one, answers 409 naming
// the state; an unknown one 404.
func TestRunTaskNow(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	later, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: []byte(`{}`), RunAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	id := later.Task.ID.String()
	r := b.do(t, "POST", "/v1/tasks/"+id+"/run", "")
	got := decode[api.RunNowResponse](t, r)
	if r.code != http.StatusOK || got.Status != task.Queued || got.WasDueAt == nil || time.Until(*got.WasDueAt) < 30*time.Minute {
		t.Fatalf("run now: %d %s, want 200 QUEUED with the old due time", r.code, r.body)
	}
	tk, err := b.store.Get(ctx, later.Task.ID)
	if err != nil {
		t.Fatal(err)
	}
	if tk.NextRetryAt == nil || tk.NextRetryAt.After(time.Now()) {
		t.Fatalf("next_retry_at = %v after run-now, want now", tk.NextRetryAt)
	}
	r = b.do(t, "POST", "/v1/tasks/"+id+"/run", "")
	if msg, field := r.errorBody(t); r.code != http.StatusConflict || field != "id" || !strings.Contains(msg, "already due") {
		t.Fatalf("run now again: %d %q field %q, want 409 already due", r.code, msg, field)
	}
	if _, err := b.store.Start(ctx, "w", time.Minute, later.Task.ID); err != nil {
		t.Fatal(err)
	}
	r = b.do(t, "POST", "/v1/tasks/"+id+"/run", "")
	if msg, _ := r.errorBody(t); r.code != http.StatusConflict || !strings.Contains(msg, "RUNNING") {
		t.Fatalf("run now a running task: %d %q, want 409 RUNNING", r.code, msg)
	}
	if r := b.do(t, "POST", "/v1/tasks/"+uuid.NewString()+"/run", ""); r.code != http.StatusNotFound {
		t.Fatalf("run now unknown: %d, want 404", r.code)
	}
}

// counterValue returns the value of counter name with label=value in reg
// (0 when it has no such series).
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
