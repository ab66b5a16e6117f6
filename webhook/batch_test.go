package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/webhook"
)

// batchServer answers each batch POST with respond(the request's body),
// recording the bodies and the keys header.
func batchServer(t *testing.T, respond func(w http.ResponseWriter, body webhook.BatchRequest)) (*httptest.Server, *[]string) {
	t.Helper()
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body webhook.BatchRequest
		if err := json.Unmarshal(b, &body); err != nil {
			t.Errorf("batch body %q: %v", b, err)
		}
		keys = append(keys, r.Header.Get(webhook.IdempotencyKeyHeader))
		respond(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &keys
}

func newBatchHandler(t *testing.T, cfg webhook.Config) ingest.BatchHandler {
	t.Helper()
	h, err := webhook.NewBatch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func batchOf(n int) []ingest.Task {
	ts := make([]ingest.Task, n)
	for i := range ts {
		ts[i] = testTask()
	}
	return ts
}

func answer(code int, contentType, body string) func(http.ResponseWriter, webhook.BatchRequest) {
	return func(w http.ResponseWriter, _ webhook.BatchRequest) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

// TestBatchPerTaskOutcomes: one POST carries every task; each result
// becomes that task's outcome (ok with or without a result, retry, retry
// after, fail), in any order of the response.
func TestBatchPerTaskOutcomes(t *testing.T) {
	t.Parallel()
	tasks := batchOf(5)
	srv, keys := batchServer(t, func(w http.ResponseWriter, body webhook.BatchRequest) {
		if len(body.Tasks) != 5 {
			t.Errorf("%d tasks in the body, want 5", len(body.Tasks))
		}
		for i, r := range body.Tasks {
			if r.TaskID != tasks[i].ID || r.Kind != tasks[i].Kind || r.Attempt != tasks[i].Attempt || string(r.Payload) != string(tasks[i].Payload) {
				t.Errorf("tasks[%d] = %+v, want %+v", i, r, tasks[i])
			}
		}
		res := webhook.BatchResponse{Results: []webhook.TaskResult{
			{TaskID: tasks[4].ID, Status: "fail", Error: "unknown recipient"},
			{TaskID: tasks[0].ID, Status: "ok", Result: json.RawMessage(`{"sent":true}`)},
			{TaskID: tasks[1].ID, Status: "ok"},
			{TaskID: tasks[2].ID, Status: "retry", Error: "mailbox busy"},
			{TaskID: tasks[3].ID, Status: "retry", RetryAfterSeconds: 30},
		}}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
	outs, err := newBatchHandler(t, webhook.Config{URL: srv.URL})(context.Background(), tasks)
	if err != nil {
		t.Fatal(err)
	}
	if len(*keys) != 1 || (*keys)[0] != "" {
		t.Errorf("requests' %s %q, want one request without the header", webhook.IdempotencyKeyHeader, *keys)
	}
	by := map[uuid.UUID]ingest.Outcome{}
	for _, o := range outs {
		by[o.TaskID] = o
	}
	if o := by[tasks[0].ID]; o.Err != nil || string(o.Result.(json.RawMessage)) != `{"sent":true}` {
		t.Errorf("ok with result: %+v", o)
	}
	if o := by[tasks[1].ID]; o.Err != nil || o.Result != nil {
		t.Errorf("ok without result: %+v", o)
	}
	if o := by[tasks[2].ID]; o.Err == nil || ingest.IsPermanent(o.Err) || !strings.Contains(o.Err.Error(), "mailbox busy") {
		t.Errorf("retry: %+v", o)
	}
	if o := by[tasks[3].ID]; o.Err == nil {
		t.Errorf("retry after: %+v", o)
	} else if d, ok := ingest.RetryDelay(o.Err); !ok || d != 30*time.Second {
		t.Errorf("retry after: delay %s, %v; want 30s", d, ok)
	}
	if o := by[tasks[4].ID]; !ingest.IsPermanent(o.Err) || !strings.Contains(o.Err.Error(), "unknown recipient") {
		t.Errorf("fail: %+v", o)
	}
}

// TestBatchFailuresFailEveryTask: a non-2xx answer or a malformed 2xx
// answer fails the whole batch (an error, never a permanent one), naming
// the problem; a result over the limit fails its task only.
func TestBatchFailuresFailEveryTask(t *testing.T) {
	t.Parallel()
	tasks := batchOf(2)
	ok := `{"task_id":"` + tasks[0].ID.String() + `","status":"ok"}`
	for _, tc := range []struct {
		name    string
		respond func(http.ResponseWriter, webhook.BatchRequest)
		want    string
		delay   time.Duration
	}{
		{"ServerError", answer(500, "", "down"), "500 Internal Server Error: down", 0},
		{"BadRequestIsNotPermanent", answer(400, "", "no"), "400 Bad Request", 0},
		{"TooManyRequestsRetryAfter", func(w http.ResponseWriter, _ webhook.BatchRequest) {
			w.Header().Set("Retry-After", "9")
			w.WriteHeader(429)
		}, "429", 9 * time.Second},
		{"NotJSON", answer(200, "text/plain", "OK"), `malformed batch response: Content-Type is "text/plain"`, 0},
		{"InvalidJSON", answer(200, "application/json", `{"results":[`), "malformed batch response", 0},
		{"NoResults", answer(200, "application/json", `{}`), `no "results" array`, 0},
		{"UnknownField", answer(200, "application/json", `{"results":[],"extra":1}`), `unknown field "extra"`, 0},
		{"BadStatus", answer(200, "application/json", `{"results":[{"task_id":"`+tasks[0].ID.String()+`","status":"done"}]}`), `results[0]: status "done"`, 0},
		{"NoTaskID", answer(200, "application/json", `{"results":[`+ok+`,{"status":"ok"}]}`), "results[1]: no task_id", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, _ := batchServer(t, tc.respond)
			outs, err := newBatchHandler(t, webhook.Config{URL: srv.URL})(context.Background(), tasks)
			if err == nil || outs != nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "a batch of 2 tasks") {
				t.Fatalf("= %v, %v; want no outcomes and an error with %q", outs, err, tc.want)
			}
			if ingest.IsPermanent(err) {
				t.Errorf("%v is permanent; a batch's failure must not bury its tasks", err)
			}
			if d, _ := ingest.RetryDelay(err); d != tc.delay {
				t.Errorf("retry delay %s, want %s", d, tc.delay)
			}
		})
	}
	t.Run("ResultTooLarge", func(t *testing.T) {
		t.Parallel()
		big := `"` + strings.Repeat("x", 100) + `"`
		srv, _ := batchServer(t, answer(200, "application/json", `{"results":[`+ok+`,{"task_id":"`+tasks[1].ID.String()+`","status":"ok","result":`+big+`}]}`))
		outs, err := newBatchHandler(t, webhook.Config{URL: srv.URL, MaxResultBytes: 64})(context.Background(), tasks)
		if err != nil || len(outs) != 2 {
			t.Fatalf("= %v, %v", outs, err)
		}
		if outs[0].Err != nil || outs[1].Err == nil || !strings.Contains(outs[1].Err.Error(), "larger than 64 bytes") {
			t.Errorf("outcomes %+v: want the first ok, the second failed for its size", outs)
		}
	})
}
