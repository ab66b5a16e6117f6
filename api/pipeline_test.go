package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// running creates a task and starts it under owner "w".
func (b *bundle) running(t *testing.T) task.Task {
	t.Helper()
	ctx := context.Background()
	res, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if rs, err := b.store.Start(ctx, "w", time.Minute, res.Task.ID); err != nil || rs[0].Outcome != task.Started {
		t.Fatalf("Start = %+v, %v", rs, err)
	}
	return res.Task
}

// TestProgressRoute checks POST /v1/tasks/{id}/progress: the current
// attempt's report is shown by GET, a stale attempt and a task that does
// not run answer 409, bad fields 400 naming them, an unknown task 404;
// a hostile message comes back as escaped JSON.
func TestProgressRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, options{token: "tok"})
	x := b.running(t)
	path := "/v1/tasks/" + x.ID.String()
	if r := b.do(t, "GET", path, ""); r.code != 200 || !strings.Contains(string(r.body), `"result":null`) || !strings.Contains(string(r.body), `"progress":null`) {
		t.Fatalf("GET before any progress: %d %s; want result and progress null", r.code, r.body)
	}
	msg := "page 3 \x1b[31m<script>\u202e"
	body, _ := json.Marshal(map[string]any{"attempt": 1, "percent": 30, "message": msg})
	if r := b.do(t, "POST", path+"/progress", string(body)); r.code != http.StatusNoContent {
		t.Fatalf("progress: %d %s, want 204", r.code, r.body)
	}
	r := b.do(t, "GET", path, "")
	got := decode[struct {
		Progress *task.Progress `json:"progress"`
	}](t, r)
	if got.Progress == nil || got.Progress.Percent != 30 || got.Progress.Message != msg {
		t.Fatalf("GET progress = %+v, want 30 and the message", got.Progress)
	}
	if strings.ContainsAny(string(r.body), "\x1b\u202e") {
		t.Errorf("the body carries raw control characters: %q", r.body)
	}
	for _, tc := range []struct {
		body  string
		code  int
		field string
	}{
		{`{"attempt": 2, "percent": 40}`, http.StatusConflict, "attempt"},
		{`{"attempt": 1, "percent": 101}`, http.StatusBadRequest, "percent"},
		{`{"attempt": 1, "percent": 1.5}`, http.StatusBadRequest, "percent"},
		{`{"attempt": 99999999999999999999, "percent": 1}`, http.StatusBadRequest, "attempt"},
		{`{"percent": 1}`, http.StatusBadRequest, "attempt"},
		{`{"attempt": 1}`, http.StatusBadRequest, "percent"},
		{`{"attempt": 1, "percent": 1, "message": "` + strings.Repeat("m", task.MaxProgressMessageBytes+1) + `"}`, http.StatusBadRequest, "message"},
		{`{"attempt": 1, "percent": 1, "extra": 1}`, http.StatusBadRequest, "extra"},
	} {
		r := b.do(t, "POST", path+"/progress", tc.body)
		if _, field := r.errorBody(t); r.code != tc.code || field != tc.field {
			t.Errorf("%.60s: %d %s, want %d naming %s", tc.body, r.code, r.body, tc.code, tc.field)
		}
	}
	if r := b.do(t, "POST", "/v1/tasks/"+uuid.NewString()+"/progress", `{"attempt": 1, "percent": 1}`); r.code != http.StatusNotFound {
		t.Errorf("unknown task: %d %s, want 404", r.code, r.body)
	}
	if _, err := b.store.Succeed(context.Background(), "w", x.ID); err != nil {
		t.Fatal(err)
	}
	if r := b.do(t, "POST", path+"/progress", `{"attempt": 1, "percent": 100}`); r.code != http.StatusConflict {
		t.Errorf("progress of a SUCCEEDED task: %d %s, want 409", r.code, r.body)
	}
	if r := b.do(t, "POST", path+"/progress", `{"attempt": 1, "percent": 1}`, "Sec-Fetch-Site", "cross-site"); r.code != http.StatusForbidden {
		t.Errorf("a cross-site report: %d, want 403", r.code)
	}
	b.token = ""
	if r := b.do(t, "POST", path+"/progress", `{"attempt": 1, "percent": 1}`); r.code != http.StatusUnauthorized {
		t.Errorf("a report without the token: %d, want 401", r.code)
	}
}

// TestGetWait checks GET /v1/tasks/{id}?wait=: it returns once the task
// ends, long before the wait is over, with its result; a wait that ends
// first returns the task as it is; a bad wait is 400 naming wait.
func TestGetWait(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	x := b.running(t)
	path := "/v1/tasks/" + x.ID.String()
	for _, bad := range []string{"61s", "-1s", "soon", "1h"} {
		r := b.do(t, "GET", path+"?wait="+bad, "")
		if _, field := r.errorBody(t); r.code != http.StatusBadRequest || field != "wait" {
			t.Errorf("wait=%s: %d %s, want 400 naming wait", bad, r.code, r.body)
		}
	}
	if r := b.do(t, "GET", "/v1/tasks/"+uuid.NewString()+"?wait=5s", ""); r.code != http.StatusNotFound {
		t.Errorf("wait for an unknown task: %d %s, want 404", r.code, r.body)
	}
	r := b.do(t, "GET", path+"?wait=100ms", "")
	if got := decode[task.Task](t, r); r.code != 200 || got.Status != task.Running {
		t.Errorf("a wait that ends first: %d %s, want 200 and RUNNING", r.code, r.body)
	}

	var lat []time.Duration
	for i := range 10 {
		if i > 0 {
			x = b.running(t)
			path = "/v1/tasks/" + x.ID.String()
		}
		type ret struct {
			r  response
			at time.Time
		}
		done := make(chan ret, 1)
		go func() {
			r := b.do(t, "GET", path+"?wait=60s", "")
			done <- ret{r, time.Now()}
		}()
		// The success is committed while the request waits (or before it
		// reads the task: then it answers at once).
		res, err := b.store.SucceedWith(context.Background(), "w", task.Success{ID: x.ID, Result: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
		if err != nil || !res[0].Applied {
			t.Fatalf("SucceedWith = %+v, %v", res, err)
		}
		committed := time.Now()
		select {
		case got := <-done:
			body := decode[struct {
				Status task.State      `json:"status"`
				Result json.RawMessage `json:"result"`
			}](t, got.r)
			if got.r.code != 200 || body.Status != task.Succeeded || string(body.Result) != fmt.Sprintf(`{"n":%d}`, i) {
				t.Fatalf("wait=60s: %d %s, want 200 SUCCEEDED with its result", got.r.code, got.r.body)
			}
			lat = append(lat, got.at.Sub(committed))
		case <-time.After(55 * time.Second):
			t.Fatal("wait=60s did not return once the task ended")
		}
	}
	slices.Sort(lat)
	t.Logf("commit → GET ?wait returned, %d waits: p50 %s, max %s", len(lat), lat[len(lat)/2], lat[len(lat)-1])
}
