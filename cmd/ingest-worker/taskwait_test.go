package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/webhook"
)

// TestTaskWaitAndShow: task wait exits 0 once a task SUCCEEDED (woken
// while it waits), 1 for a DEAD task and when the timeout passes first, 2
// for bad arguments; task show prints the progress and the result,
// indented, cut with a note, without raw control characters.
func TestTaskWaitAndShow(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	env := []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey}
	ctx := context.Background()
	store, err := task.NewStore(task.Config{Stream: stream}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	running := func() uuid.UUID {
		t.Helper()
		r, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if rs, err := store.Start(ctx, "w", time.Minute, r.Task.ID); err != nil || rs[0].Outcome != task.Started {
			t.Fatalf("Start = %+v, %v", rs, err)
		}
		return r.Task.ID
	}

	for _, args := range [][]string{{"task", "wait"}, {"task", "wait", "nope"}, {"task", "wait", uuid.NewString(), "--timeout", "soon"}} {
		if r := runBin(t, bin, env, "", args...); r.code != exitUsage {
			t.Errorf("%v: exit %d, want %d\n%s", args, r.code, exitUsage, r.stderr)
		}
	}

	id := running()
	if r := runBin(t, bin, env, "", "task", "wait", id.String(), "--timeout", "300ms"); r.code != exitRuntime ||
		!strings.Contains(r.stdout, "RUNNING") || !strings.Contains(r.stderr, "still RUNNING") {
		t.Errorf("timeout first: exit %d, stdout %q, stderr %q; want 1 and RUNNING", r.code, r.stdout, r.stderr)
	}

	// Woken while it waits: the success commits after the command started.
	p := start(t, bin, env, "task", "wait", id.String(), "--timeout", "60s")
	testenv.Eventually(t, 30*time.Second, "task wait listening", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ingest-task-awaiter'`).Scan(&n)
		return n == 1
	})
	if err := store.SetProgress(ctx, task.ProgressReport{ID: id, Attempt: 1, Percent: 99, Message: "almost \x1b[2J"}); err != nil {
		t.Fatal(err)
	}
	items := make([]string, 60)
	for i := range items {
		items[i] = fmt.Sprintf(`"line %d \u001b[31m"`, i)
	}
	result := `{"items": [` + strings.Join(items, ",") + `]}`
	if _, err := store.SucceedWith(ctx, "w", task.Success{ID: id, Result: json.RawMessage(result)}); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(30 * time.Second); code != exitOK || !strings.Contains(p.stdout.String(), "SUCCEEDED") {
		t.Errorf("wait for a task that succeeds: exit %d, stdout %q, stderr %q", code, p.stdout.String(), p.stderr.String())
	}

	out := mustRun(t, bin, env, "", "task", "show", id.String())
	for _, want := range []string{"99% almost", "RESULT", `"items": [`, "    \"line 0 ", "… cut: the result is"} {
		if !strings.Contains(out, want) {
			t.Errorf("task show lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsRune(out, 0x1b) {
		t.Errorf("task show printed a raw ESC:\n%q", out)
	}
	var shown struct {
		Task task.Task `json:"task"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "task", "show", id.String(), "--json")), &shown); err != nil {
		t.Fatal(err)
	}
	if shown.Task.Progress == nil || shown.Task.Progress.Percent != 99 || len(shown.Task.Result) == 0 {
		t.Errorf("task show --json: progress %+v, result %d bytes", shown.Task.Progress, len(shown.Task.Result))
	}

	dead := running()
	if _, err := store.Fail(ctx, "w", task.Failure{ID: dead, Error: "boom", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if r := runBin(t, bin, env, "", "task", "wait", dead.String()); r.code != exitRuntime || !strings.Contains(r.stdout, "DEAD") || !strings.Contains(r.stdout, "boom") {
		t.Errorf("wait for a DEAD task: exit %d, stdout %q; want 1, DEAD and its error", r.code, r.stdout)
	}
}

// TestBinaryWebhookPipeline runs the binary with a webhook receiver that,
// as an external handler, reports progress through the API with the
// attempt it was given (a stale attempt is refused) and answers with a
// JSON body: the result GET ?wait returns once the task succeeded.
func TestBinaryWebhookPipeline(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	addr := freeAddr(t)
	base := "http://" + addr
	const token = "pipeline-token"
	type report struct{ fresh, stale int }
	reports := make(chan report, 10)
	_, hook := newReceiver(t, func(w http.ResponseWriter, r *http.Request, req webhook.Request) {
		progress := func(attempt int) int {
			code, _ := apiCall(t, "POST", base+"/v1/tasks/"+req.TaskID.String()+"/progress", token,
				fmt.Sprintf(`{"attempt": %d, "percent": 60, "message": "converted"}`, attempt))
			return code
		}
		reports <- report{fresh: progress(req.Attempt), stale: progress(req.Attempt + 1)}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"converted": %q}`, req.TaskID)
	})
	env := []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_WEBHOOK_URL=" + hook.URL + "/hook", "INGEST_API_TOKEN=" + token, "INGEST_CONSUMER_NAME=pipe-" + uuid.NewString()[:8]}
	worker := start(t, bin, env, "run", "--http-addr", addr)
	waitReady(t, worker, addr)
	code, body := apiCall(t, "POST", base+"/v1/tasks", token, `{"kind":"doc.convert","payload":{"url":"https://example.com/a.pdf"}}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var created struct{ ID uuid.UUID }
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	code, body = apiCall(t, "GET", base+"/v1/tasks/"+created.ID.String()+"?wait=60s", token, "")
	var got struct {
		Status   task.State      `json:"status"`
		Result   json.RawMessage `json:"result"`
		Progress *task.Progress  `json:"progress"`
	}
	if err := json.Unmarshal(body, &got); err != nil || code != 200 {
		t.Fatalf("GET ?wait=60s: %d %s (%v)", code, body, err)
	}
	var result struct{ Converted uuid.UUID }
	if got.Status != task.Succeeded || json.Unmarshal(got.Result, &result) != nil || result.Converted != created.ID ||
		got.Progress == nil || got.Progress.Percent != 60 {
		t.Errorf("GET ?wait=60s = %s; want SUCCEEDED with the receiver's result and progress 60", body)
	}
	if r := <-reports; r.fresh != http.StatusNoContent || r.stale != http.StatusConflict {
		t.Errorf("progress from the receiver: current attempt %d, stale attempt %d; want 204 and 409", r.fresh, r.stale)
	}
}
