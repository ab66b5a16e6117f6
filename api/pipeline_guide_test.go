package api_test

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/api"
)

// TestPipelineGuideOverHTTP sends the requests of the HTTP form of
// docs/PIPELINES.md ("A document-ingestion pipeline, end to end"): the
// upload's batch (a repeat finds the same three tasks), the split's
// fan-out naming the split by id and its own items by ref (a repeat adds
// nothing), and the workflow's listing, which holds all seven tasks.
func TestPipelineGuideOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	const upload = `[
  {"kind": "doc.fetch", "ref": "fetch", "idempotency_key": "https://example.com/a.pdf",
   "payload": {"url": "https://example.com/a.pdf", "email": "ops@example.com"}},
  {"kind": "doc.parse", "ref": "parse", "depends_on": ["fetch"], "idempotency_key": "https://example.com/a.pdf",
   "payload": {"url": "https://example.com/a.pdf", "email": "ops@example.com"}},
  {"kind": "doc.split", "depends_on": ["parse"], "idempotency_key": "https://example.com/a.pdf",
   "payload": {"url": "https://example.com/a.pdf", "email": "ops@example.com"}}]`
	const fanOut = `[
  {"kind": "doc.embed", "ref": "embed-0", "depends_on": ["'$SPLIT'"], "idempotency_key": "'$SPLIT'/0",
   "payload": {"n": 0, "text": "Annual report"}},
  {"kind": "doc.embed", "ref": "embed-1", "depends_on": ["'$SPLIT'"], "idempotency_key": "'$SPLIT'/1",
   "payload": {"n": 1, "text": "Revenue grew"}},
  {"kind": "doc.index", "ref": "index", "depends_on": ["embed-0", "embed-1"], "idempotency_key": "'$SPLIT'",
   "payload": {"url": "https://example.com/a.pdf"}},
  {"kind": "doc.notify", "depends_on": ["index"], "on_dependency_failure": "run", "idempotency_key": "'$SPLIT'",
   "payload": {"url": "https://example.com/a.pdf", "email": "ops@example.com"}}]`
	guide, err := os.ReadFile("../docs/PIPELINES.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{upload, fanOut} {
		if !strings.Contains(string(guide), "-d '"+body+"'") {
			t.Fatalf("docs/PIPELINES.md does not send this body; copy it there:\n%s", body)
		}
	}
	post := func(body string, code int) []api.CreateResponse {
		t.Helper()
		r := b.do(t, "POST", "/v1/tasks:batch", body)
		if r.code != code {
			t.Fatalf("POST /v1/tasks:batch: %d %s, want %d", r.code, r.body, code)
		}
		return decode[api.BatchResponse](t, r).Tasks
	}
	first := post(upload, http.StatusCreated)
	if again := post(upload, http.StatusOK); again[0].ID != first[0].ID || again[2].ID != first[2].ID || !again[2].Existing {
		t.Fatalf("a repeated upload: %+v, want the first one's tasks", again)
	}
	root, split := first[0].ID.String(), first[2].ID.String()
	// The shell's quoting: '$SPLIT' closes the single-quoted body,
	// inserts the split's id and reopens it.
	body := strings.ReplaceAll(fanOut, `'$SPLIT'`, split)
	tasks := post(body, http.StatusCreated)
	if len(tasks) != 4 || post(body, http.StatusOK)[3].ID != tasks[3].ID {
		t.Fatalf("the fan-out %+v is not found again by a repeat", tasks)
	}
	r := b.do(t, "GET", "/v1/tasks/"+tasks[3].ID.String(), "")
	got := decode[api.TaskResponse](t, r)
	if got.WorkflowID == nil || got.WorkflowID.String() != root || got.OnDependencyFailure != "run" || got.WaitingFor != 1 {
		t.Fatalf("the notice: %s, want it in workflow %s, waiting for the index, run on failure", r.body, root)
	}
	r = b.do(t, "GET", "/v1/tasks?workflow="+root, "")
	if l := decode[api.ListResponse](t, r); r.code != http.StatusOK || len(l.Tasks) != 7 {
		t.Fatalf("GET /v1/tasks?workflow=%s: %d %s, want the document's 7 tasks", root, r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/tasks?workflow="+root+"&kind=doc.notify", "")
	if l := decode[api.ListResponse](t, r); len(l.Tasks) != 1 || l.Tasks[0].ID != tasks[3].ID {
		t.Fatalf("the workflow's doc.notify: %s", r.body)
	}
}
