package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/api"
)

// TestListWorkflow: GET /v1/tasks?workflow= lists the tasks of one
// pipeline created in a batch with refs (its root included), not another
// one's; a value that is not a UUID is a 400 naming workflow, and an id no
// task has lists nothing.
func TestListWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	pipeline := func() []uuid.UUID {
		r := b.do(t, "POST", "/v1/tasks:batch", `[
			{"kind":"fetch","payload":1,"ref":"fetch"},
			{"kind":"embed","payload":1,"ref":"e1","depends_on":["fetch"]},
			{"kind":"embed","payload":2,"ref":"e2","depends_on":["fetch"]},
			{"kind":"notify","payload":3,"depends_on":["e1","e2"]}]`)
		if r.code != http.StatusCreated {
			t.Fatalf("%d %s", r.code, r.body)
		}
		var ids []uuid.UUID
		for _, x := range decode[api.BatchResponse](t, r).Tasks {
			ids = append(ids, x.ID)
		}
		return ids
	}
	mine, other := pipeline(), pipeline()
	r := b.do(t, "GET", "/v1/tasks?workflow="+mine[0].String()+"&kind=embed", "")
	l := decode[api.ListResponse](t, r)
	if r.code != http.StatusOK || len(l.Tasks) != 2 || l.Tasks[0].ID != mine[2] || l.Tasks[1].ID != mine[1] {
		t.Fatalf("?workflow=<mine>&kind=embed: %d %s, want its two embeds newest first", r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/tasks?workflow="+other[0].String(), "")
	if l := decode[api.ListResponse](t, r); r.code != http.StatusOK || len(l.Tasks) != 4 || l.Tasks[3].ID != other[0] {
		t.Fatalf("?workflow=<other>: %d %s, want its 4 tasks, the root last", r.code, r.body)
	}

	r = b.do(t, "GET", "/v1/tasks?workflow=doc-1", "")
	if msg, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "workflow" || !strings.Contains(msg, `"doc-1"`) {
		t.Fatalf("?workflow=doc-1: %d %q field %q, want 400 naming workflow and the value", r.code, msg, field)
	}
	r = b.do(t, "GET", "/v1/tasks?workflow="+uuid.NewString(), "")
	if l := decode[api.ListResponse](t, r); r.code != http.StatusOK || len(l.Tasks) != 0 {
		t.Fatalf("?workflow=<unknown>: %d %s, want 200 and no tasks", r.code, r.body)
	}
}
