package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/api"
)

// TestListWorkflowMalformed: ?workflow= takes a workflow id (a UUID);
// anything else is a 400 naming workflow, and an id no task has lists
// nothing.
func TestListWorkflowMalformed(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	r := b.do(t, "GET", "/v1/tasks?workflow=doc-1", "")
	if msg, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "workflow" || !strings.Contains(msg, `"doc-1"`) {
		t.Fatalf("?workflow=doc-1: %d %q field %q, want 400 naming workflow and the value", r.code, msg, field)
	}
	r = b.do(t, "GET", "/v1/tasks?workflow="+uuid.NewString(), "")
	if l := decode[api.ListResponse](t, r); r.code != http.StatusOK || len(l.Tasks) != 0 {
		t.Fatalf("?workflow=<unknown>: %d %s, want 200 and no tasks", r.code, r.body)
	}
}
