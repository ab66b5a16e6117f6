package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/task"
)

// TestBulkRedrive: POST /v1/tasks/redrive selects DEAD tasks by kind and
// error, a dry run changes nothing, the redrive moves them to QUEUED
// (audited with the server's actor) and removes their DLQ entries only;
// bad filters are 400s naming the field.
func TestBulkRedrive(t *testing.T) {
	t.Parallel()
	b := setup(t, options{dlq: true})
	ctx := t.Context()
	kill := func(kind, msg string) uuid.UUID { return b.kill(t, kind, msg) }
	up1, up2 := kill("bk", "embed: upstream 503"), kill("bk", "embed: upstream 503")
	other := kill("bk", "bad input")
	dlqLen := func() int64 { return b.dlqLen(t) }

	body := `{"status":"DEAD","kind":"bk","error_contains":"503"%s}`
	r := b.do(t, "POST", "/v1/tasks/redrive", fmt.Sprintf(body, `,"dry_run":true`))
	dry := decode[dlq.BulkRedriveResult](t, r)
	if r.code != http.StatusOK || dry.Matched != 2 || dry.Redriven != 0 || !slices.Equal(dry.IDs, []uuid.UUID{up2, up1}) || dlqLen() != 3 {
		t.Fatalf("dry run: %d %s, DLQ length %d; want 2 matched (newest first), nothing changed", r.code, r.body, dlqLen())
	}
	r = b.do(t, "POST", "/v1/tasks/redrive", fmt.Sprintf(body, ""))
	res := decode[dlq.BulkRedriveResult](t, r)
	if r.code != http.StatusOK || res.Matched != 2 || res.Redriven != 2 || res.DLQRemoved != 2 {
		t.Fatalf("redrive: %d %s; want 2 matched, redriven and removed from the DLQ", r.code, r.body)
	}
	left, err := dlq.List(ctx, b.rdb, b.dlq, dlq.ListParams{})
	if err != nil || len(left) != 1 || left[0].TaskID != other.String() {
		t.Fatalf("DLQ after the redrive: %+v %v; want only the entry of %s", left, err, other)
	}
	for _, id := range []uuid.UUID{up1, up2} {
		tk, trs, err := b.store.GetWithTransitions(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		last := trs[len(trs)-1]
		if tk.Status != task.Queued || last.From != "DEAD" || last.To != "QUEUED" || last.Worker != "api" || last.Message != "redrive" {
			t.Fatalf("task %s: %s, last transition %+v", id, tk.Status, last)
		}
	}
	if tk, err := b.store.Get(ctx, other); err != nil || tk.Status != task.Dead {
		t.Fatalf("task outside the filter: %+v %v", tk.Status, err)
	}

	for _, tc := range []struct{ body, field string }{
		{`{"status":"QUEUED"}`, "status"},
		{`{}`, "status"},
		{`{"status":"DEAD","limit":-5}`, "limit"},
		{`{"status":"DEAD","since":"2026-11-24T10:00:00Z","until":"2026-11-24T09:00:00Z"}`, "since"},
		{`{"status":"DEAD","since":"yesterday"}`, "since"},
		{`{"status":"DEAD","bogus":1}`, "bogus"},
	} {
		r := b.do(t, "POST", "/v1/tasks/redrive", tc.body)
		if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != tc.field {
			t.Errorf("%s: %d %s, want 400 naming %s", tc.body, r.code, r.body, tc.field)
		}
	}
}

// kill creates a task of kind, fails it for good with msg and adds the
// DLQ entry a worker writes for the death.
func (b *bundle) kill(t *testing.T, kind, msg string) uuid.UUID {
	t.Helper()
	ctx := t.Context()
	r, err := b.store.Create(ctx, task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Task.ID
	b.die(t, id, msg)
	return id
}

// die starts the QUEUED task id, fails it for good with msg and adds the
// DLQ entry a worker writes for the death.
func (b *bundle) die(t *testing.T, id uuid.UUID, msg string) {
	t.Helper()
	ctx := t.Context()
	if _, err := b.store.Start(ctx, "w", time.Minute, id); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Fail(ctx, "w", task.Failure{ID: id, Error: msg, Permanent: true})
	if err != nil || res[0].Status != task.Dead {
		t.Fatalf("fail: %+v %v", res, err)
	}
	tk, err := b.store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.dlq, Values: []any{"task_id", id.String(), "kind", tk.Kind, "last_error", msg}}).Err(); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) dlqLen(t *testing.T) int64 {
	t.Helper()
	n, err := b.rdb.XLen(t.Context(), b.dlq).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRedriveRemovesTheDLQEntry: POST /v1/tasks/{id}/redrive removes the
// task's DLQ entry as every other redrive does, so that a task that dies
// again has one entry, and the DLQ's depth is the number of DEAD tasks.
func TestRedriveRemovesTheDLQEntry(t *testing.T) {
	t.Parallel()
	b := setup(t, options{dlq: true})
	id, other := b.kill(t, "one", "boom"), b.kill(t, "one", "boom")
	r := b.do(t, "POST", "/v1/tasks/"+id.String()+"/redrive", "")
	if res := decode[api.RedriveResponse](t, r); r.code != http.StatusOK || res.Status != task.Queued || res.DLQRemoved != 1 {
		t.Fatalf("redrive: %d %s; want 200, QUEUED, one DLQ entry removed", r.code, r.body)
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("DLQ depth %d after redriving one of two DEAD tasks, want 1", n)
	}
	b.die(t, id, "boom again")
	left, err := dlq.List(t.Context(), b.rdb, b.dlq, dlq.ListParams{})
	if err != nil || len(left) != 2 || left[0].TaskID != other.String() || left[1].TaskID != id.String() || left[1].LastError != "boom again" {
		t.Fatalf("DLQ after the task died again: %+v %v; want one entry per DEAD task", left, err)
	}
}

// TestBulkRedriveByIDs: ids narrow a bulk redrive to the tasks a dry run
// listed; a task that died after the dry run stays DEAD.
func TestBulkRedriveByIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, options{dlq: true})
	a, c := b.kill(t, "ids", "boom"), b.kill(t, "ids", "boom")
	r := b.do(t, "POST", "/v1/tasks/redrive", `{"status":"DEAD","kind":"ids","dry_run":true}`)
	dry := decode[dlq.BulkRedriveResult](t, r)
	if r.code != http.StatusOK || dry.Matched != 2 {
		t.Fatalf("dry run: %d %s", r.code, r.body)
	}
	late := b.kill(t, "ids", "boom")
	ids, _ := json.Marshal(dry.IDs)
	r = b.do(t, "POST", "/v1/tasks/redrive", fmt.Sprintf(`{"status":"DEAD","kind":"ids","ids":%s}`, ids))
	res := decode[dlq.BulkRedriveResult](t, r)
	if r.code != http.StatusOK || res.Matched != 2 || res.Redriven != 2 || res.DLQRemoved != 2 || !slices.Equal(res.IDs, []uuid.UUID{c, a}) {
		t.Fatalf("redrive by ids: %d %s; want the dry run's 2 tasks", r.code, r.body)
	}
	if tk, err := b.store.Get(t.Context(), late); err != nil || tk.Status != task.Dead {
		t.Fatalf("the task that died after the dry run: %v %v, want DEAD", tk.Status, err)
	}
	r = b.do(t, "POST", "/v1/tasks/redrive", `{"status":"DEAD","ids":["nope"]}`)
	if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "ids[0]" {
		t.Fatalf("a bad id: %d %s, want 400 naming ids[0]", r.code, r.body)
	}
}
