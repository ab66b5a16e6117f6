package api_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/task"
)

// TestSequences: POST /v1/tasks and :batch take sequence_key (a bad one is
// a 400 naming it); PUT /v1/kinds/{kind} sets sequence_on_failure (a bad
// value is a 400 naming it); a DEAD head is counted by GET /v1/kinds and
// listed by GET /v1/sequences/blocked.
func TestSequences(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	r := b.do(t, "POST", "/v1/tasks", `{"kind":"index","payload":1,"sequence_key":"doc-1"}`)
	head := decode[api.CreateResponse](t, r)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	r = b.do(t, "POST", "/v1/tasks:batch", `[{"kind":"index","payload":2,"sequence_key":"doc-1"},{"kind":"index","payload":3,"sequence_key":"doc-1"}]`)
	if r.code != http.StatusCreated {
		t.Fatalf("batch: %d %s", r.code, r.body)
	}
	r = b.do(t, "GET", "/v1/tasks/"+decode[api.BatchResponse](t, r).Tasks[1].ID.String(), "")
	if tk := decode[api.TaskResponse](t, r); tk.SequenceKey != "doc-1" || tk.SequenceNo == nil || *tk.SequenceNo != 3 || tk.WaitingFor != 1 {
		t.Fatalf("the third task: %s", r.body)
	}
	for _, body := range []string{`{"kind":"index","payload":1,"sequence_key":5}`, `{"kind":"index","payload":1,"sequence_key":"a\u0000b"}`} {
		if r := b.do(t, "POST", "/v1/tasks", body); r.code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", body, r.code, r.body)
		} else if _, field := r.errorBody(t); field != "sequence_key" {
			t.Errorf("%s: 400 naming %q, want sequence_key", body, field)
		}
	}
	if r := b.do(t, "PUT", "/v1/kinds/index", `{"sequence_on_failure":"skip"}`); r.code != http.StatusBadRequest {
		t.Errorf("sequence_on_failure skip: %d %s", r.code, r.body)
	} else if _, field := r.errorBody(t); field != "sequence_on_failure" {
		t.Errorf("sequence_on_failure skip: 400 naming %q", field)
	}
	r = b.do(t, "PUT", "/v1/kinds/index", `{"sequence_on_failure":"block"}`)
	if k := decode[api.KindResponse](t, r); r.code != http.StatusOK || k.SequenceOnFailure != task.SequenceBlock {
		t.Fatalf("sequence_on_failure block: %d %s", r.code, r.body)
	}

	if _, err := b.store.Start(ctx, "w", time.Minute, head.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Fail(ctx, "w", task.Failure{ID: head.ID, Error: "bad document", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	r = b.do(t, "GET", "/v1/kinds", "")
	if l := decode[api.KindsResponse](t, r); len(l.Kinds) != 1 || l.Kinds[0].BlockedSequences != 1 {
		t.Fatalf("kinds: %s", r.body)
	}
	r = b.do(t, "GET", "/v1/sequences/blocked?kind=index", "")
	var got api.BlockedSequencesResponse
	if err := json.Unmarshal([]byte(r.body), &got); err != nil || r.code != http.StatusOK || len(got.Sequences) != 1 ||
		got.Sequences[0].TaskID != head.ID || got.Sequences[0].Waiting != 2 || got.Sequences[0].Error != "bad document" {
		t.Fatalf("blocked: %d %s", r.code, r.body)
	}
	if r := b.do(t, "GET", "/v1/sequences/blocked?blocked=1", ""); r.code != http.StatusBadRequest {
		t.Errorf("unknown parameter: %d %s", r.code, r.body)
	}
}
