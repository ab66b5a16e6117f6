package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/task"
)

// TestCreateWithDependencies: a DAG created in one batch with refs (and
// an existing task's id), shown by GET /v1/tasks/{id} with the states of
// its dependencies and dependents; cycles, unknown and deleted ids, refs
// outside a batch answer 400 naming them.
func TestCreateWithDependencies(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	r := b.do(t, "POST", "/v1/tasks", `{"kind":"fetch","payload":{"doc":1}}`)
	if r.code != http.StatusCreated {
		t.Fatalf("%d %s", r.code, r.body)
	}
	root := decode[api.CreateResponse](t, r).ID
	body := fmt.Sprintf(`[
		{"kind":"parse","payload":1,"ref":"parse","depends_on":[%q]},
		{"kind":"embed","payload":1,"ref":"e1","depends_on":["parse"]},
		{"kind":"embed","payload":2,"ref":"e2","depends_on":["parse"]},
		{"kind":"notify","payload":3,"depends_on":["e1","e2"],"on_dependency_failure":"run"}]`, root)
	r = b.do(t, "POST", "/v1/tasks:batch", body)
	if r.code != http.StatusCreated {
		t.Fatalf("%d %s", r.code, r.body)
	}
	res := decode[api.BatchResponse](t, r)
	if len(res.Tasks) != 4 {
		t.Fatalf("batch result %+v", res)
	}
	parse, notify := res.Tasks[0].ID, res.Tasks[3].ID

	r = b.do(t, "GET", "/v1/tasks/"+notify.String(), "")
	got := decode[api.TaskResponse](t, r)
	if got.WaitingFor != 2 || len(got.DependsOn) != 2 || got.OnDependencyFailure != "run" || got.WorkflowID == nil || *got.WorkflowID != root {
		t.Fatalf("notify: %s", r.body)
	}
	for _, e := range got.DependsOn {
		if e.Status != "QUEUED" || e.Kind != "embed" || e.ReleasedAt != nil {
			t.Fatalf("notify's dependency %+v", e)
		}
	}
	r = b.do(t, "GET", "/v1/tasks/"+parse.String(), "")
	got = decode[api.TaskResponse](t, r)
	if len(got.DependsOn) != 1 || got.DependsOn[0].ID != root || len(got.Dependents) != 2 {
		t.Fatalf("parse: %s", r.body)
	}

	// The root ends: parse is released, and shows it.
	if _, err := b.store.Start(ctx, "w", time.Minute, root); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Succeed(ctx, "w", root); err != nil {
		t.Fatal(err)
	}
	got = decode[api.TaskResponse](t, b.do(t, "GET", "/v1/tasks/"+parse.String(), ""))
	if got.WaitingFor != 0 || got.DependsOn[0].Status != "SUCCEEDED" || got.DependsOn[0].ReleasedAt == nil {
		t.Fatalf("parse after its dependency succeeded: %+v", got)
	}

	if _, err := b.store.Delete(ctx, root); err != nil {
		t.Fatal(err)
	}
	unknown := uuid.Must(uuid.NewV7())
	for _, c := range []struct{ path, body, want string }{
		{"/v1/tasks", fmt.Sprintf(`{"kind":"k","payload":1,"depends_on":[%q]}`, unknown), unknown.String()},
		{"/v1/tasks", fmt.Sprintf(`{"kind":"k","payload":1,"depends_on":[%q]}`, root), root.String()},
		{"/v1/tasks", `{"kind":"k","payload":1,"depends_on":["parse"]}`, `"parse" is not a task id`},
		{"/v1/tasks", `{"kind":"k","payload":1,"ref":"a"}`, "ref names an item of a batch"},
		{"/v1/tasks", `{"kind":"k","payload":1,"on_dependency_failure":"skip"}`, "on_dependency_failure"},
		{"/v1/tasks:batch", `[{"kind":"k","payload":1,"ref":"a","depends_on":["b"]},{"kind":"k","payload":1,"ref":"b","depends_on":["a"]}]`, "cycle: a -> b -> a"},
		{"/v1/tasks:batch", `[{"kind":"k","payload":1,"ref":"a","depends_on":["c"]}]`, `ref "c" names no item`},
	} {
		r := b.do(t, "POST", c.path, c.body)
		msg, field := r.errorBody(t)
		if r.code != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Errorf("POST %s %s: %d %q; want 400 naming %q", c.path, c.body, r.code, msg, c.want)
		}
		if c.path == "/v1/tasks:batch" && (!strings.HasPrefix(field, "[") || !strings.HasSuffix(field, "].depends_on")) {
			t.Errorf("POST %s %s: field %q, want [N].depends_on", c.path, c.body, field)
		}
	}
}

// TestRedriveWithDependentsAPI: POST /v1/tasks/{id}/redrive with
// with_dependents revives the dependents its death cancelled.
func TestRedriveWithDependentsAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	dep := decode[api.CreateResponse](t, b.do(t, "POST", "/v1/tasks", `{"kind":"k","payload":1,"max_attempts":1}`)).ID
	d := decode[api.CreateResponse](t, b.do(t, "POST", "/v1/tasks", fmt.Sprintf(`{"kind":"k","payload":2,"depends_on":[%q]}`, dep))).ID
	if _, err := b.store.Start(ctx, "w", time.Minute, dep); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Fail(ctx, "w", task.Failure{ID: dep, Error: "boom", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if got := decode[api.TaskResponse](t, b.do(t, "GET", "/v1/tasks/"+d.String(), "")); got.Status != task.Cancelled {
		t.Fatalf("dependent of a DEAD task is %s", got.Status)
	}
	r := b.do(t, "POST", "/v1/tasks/"+dep.String()+"/redrive", `{"with_dependents":true}`)
	res := decode[api.RedriveResponse](t, r)
	if r.code != http.StatusOK || len(res.Revived) != 1 || res.Revived[0] != d {
		t.Fatalf("redrive: %d %s", r.code, r.body)
	}
	if got := decode[api.TaskResponse](t, b.do(t, "GET", "/v1/tasks/"+d.String(), "")); got.Status != task.Queued || got.WaitingFor != 1 {
		t.Fatalf("revived dependent: %s waiting %d", got.Status, got.WaitingFor)
	}
	if r := b.do(t, "POST", "/v1/tasks/"+dep.String()+"/redrive", `{"with_dependents":"yes"}`); r.code != http.StatusBadRequest {
		t.Fatalf("a bad body: %d %s", r.code, r.body)
	}
}
