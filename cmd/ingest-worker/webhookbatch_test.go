package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/webhook"
)

// batchReceiver is a webhook target of the batch mode: it answers each
// batch by its tasks' payloads and attempts, and records the batches.
type batchReceiver struct {
	mu      sync.Mutex
	batches [][]webhook.Request
}

func (rc *batchReceiver) sizes() []int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var s []int
	for _, b := range rc.batches {
		s = append(s, len(b))
	}
	return s
}

// serve answers a batch: a task of kind e2e.hold on its first attempt
// holds the request until the worker goes away; a batch of kind
// e2e.malformed on its first attempt gets a body that is not JSON; else
// each task by its payload's mode (ok, retry once, fail, missing once).
func (rc *batchReceiver) serve(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req webhook.BatchRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Tasks) == 0 {
			t.Errorf("batch body: %v (%d tasks)", err, len(req.Tasks))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.batches = append(rc.batches, req.Tasks)
		rc.mu.Unlock()
		first := req.Tasks[0]
		switch {
		case first.Kind == "e2e.hold" && first.Attempt == 1:
			<-r.Context().Done()
			return
		case first.Kind == "e2e.malformed" && first.Attempt == 1:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"results": "soon"`))
			return
		}
		var res webhook.BatchResponse
		for _, tk := range req.Tasks {
			var p struct {
				Mode string `json:"mode"`
				N    int    `json:"n"`
			}
			_ = json.Unmarshal(tk.Payload, &p)
			ok := webhook.TaskResult{TaskID: tk.TaskID, Status: webhook.StatusOK, Result: json.RawMessage(fmt.Sprintf(`{"echo":%d}`, p.N))}
			switch {
			case p.Mode == "retry" && tk.Attempt == 1:
				res.Results = append(res.Results, webhook.TaskResult{TaskID: tk.TaskID, Status: webhook.StatusRetry, Error: "not yet"})
			case p.Mode == "fail":
				res.Results = append(res.Results, webhook.TaskResult{TaskID: tk.TaskID, Status: webhook.StatusFail, Error: "bad document"})
			case p.Mode == "missing" && tk.Attempt == 1:
			default:
				res.Results = append(res.Results, ok)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// enqueueFile creates the tasks of lines (NDJSON) with the CLI and returns
// their ids.
func enqueueFile(t *testing.T, bin string, env []string, lines ...string) []uuid.UUID {
	t.Helper()
	f := filepath.Join(t.TempDir(), "tasks.ndjson")
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for _, line := range strings.Fields(mustRun(t, bin, env, "", "enqueue", "--file", f)) {
		ids = append(ids, uuid.MustParse(line))
	}
	return ids
}

type taskRow struct {
	status   string
	attempts int
	result   string
	trail    string
}

func readTask(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) taskRow {
	t.Helper()
	ctx := context.Background()
	var r taskRow
	var result []byte
	if err := pool.QueryRow(ctx, `SELECT status, attempt_count, result FROM ingest_task WHERE id = $1`, id).Scan(&r.status, &r.attempts, &result); err != nil {
		t.Fatal(err)
	}
	r.result = string(result)
	rows, err := pool.Query(ctx, `SELECT to_status, attempt_count, coalesce(message, '') FROM ingest_task_transition WHERE task_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var to, msg string
		var n int
		if err := rows.Scan(&to, &n, &msg); err != nil {
			t.Fatal(err)
		}
		parts = append(parts, fmt.Sprintf("%s/%d", to, n))
		if msg != "" && to == "RETRYING" {
			parts[len(parts)-1] += "(" + msg + ")"
		}
	}
	r.trail = strings.Join(parts, "→")
	return r
}

// TestWebhookBatchMode runs the binary with INGEST_WEBHOOK_BATCH_MAX=4:
// tasks reach the receiver in POSTs of at most 4, each task ends by its own
// result in the answer (ok with its result, retry, fail, missing), a
// malformed answer fails its whole batch as an attempt, and a worker
// killed while a batch is out loses nothing: another worker takes the
// tasks over and finishes them.
func TestWebhookBatchMode(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	db := testenv.NewEmptyDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	rc := &batchReceiver{}
	hook := rc.serve(t)
	env := []string{
		"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_WEBHOOK_URL=" + hook.URL + "/hook", "INGEST_HTTP_ADDR=",
		"INGEST_WEBHOOK_BATCH_MAX=4", "INGEST_WEBHOOK_BATCH_WAIT_MS=200",
		"INGEST_WORKER_CONCURRENCY=16", "INGEST_TASK_LEASE_MS=1000",
		"INGEST_REDIS_RECLAIM_IDLE_MS=1000", "INGEST_REDIS_RECLAIM_INTERVAL_MS=200",
		"INGEST_REDIS_RETRY_BASE_BACKOFF_MS=50", "INGEST_REDIS_RETRY_MAX_BACKOFF_MS=200",
	}
	mustRun(t, bin, env, "", "migrate")
	a := start(t, bin, append(env, "INGEST_CONSUMER_NAME=batch-a"), "run")

	var lines []string
	var modes []string
	for i, m := range []string{"ok", "retry", "fail", "missing", "ok", "ok", "retry", "fail", "missing", "ok"} {
		lines = append(lines, fmt.Sprintf(`{"kind":"e2e.mixed","payload":{"mode":%q,"n":%d},"max_attempts":3}`, m, i))
		modes = append(modes, m)
	}
	for i := range 3 {
		lines = append(lines, fmt.Sprintf(`{"kind":"e2e.malformed","payload":{"mode":"ok","n":%d},"max_attempts":3}`, 100+i))
		modes = append(modes, "malformed")
	}
	ids := enqueueFile(t, bin, env, lines...)
	ended := func(ids []uuid.UUID) func() bool {
		return func() bool {
			var n int
			_ = db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ingest_task WHERE id = ANY($1) AND status IN ('SUCCEEDED','DEAD')`, ids).Scan(&n)
			return n == len(ids)
		}
	}
	testenv.Eventually(t, time.Minute, "every task ended", func() bool { a.mustBeRunning(); return ended(ids)() })
	for i, id := range ids {
		got := readTask(t, db.Pool, id)
		var want string
		switch modes[i] {
		case "ok":
			want = "QUEUED/0→RUNNING/0→SUCCEEDED/0"
		case "retry":
			want = "QUEUED/0→RUNNING/0→RETRYING/1(webhook: POST " + hook.URL + "/hook: task retry: not yet)→RUNNING/1→SUCCEEDED/1"
		case "fail":
			want = "QUEUED/0→RUNNING/0→DEAD/1"
		case "missing":
			want = "QUEUED/0→RUNNING/0→RETRYING/1(batch handler returned no outcome for task " + id.String()
		case "malformed":
			want = "QUEUED/0→RUNNING/0→RETRYING/1(webhook: POST " + hook.URL + "/hook (a batch of "
		}
		if !strings.HasPrefix(got.trail, want) {
			t.Errorf("%s task %s: trail %s, want it to start %s", modes[i], id, got.trail, want)
		}
		if modes[i] == "malformed" && !strings.Contains(got.trail, "malformed batch response") {
			t.Errorf("malformed task %s: trail %s, want the retry to say the response was malformed", id, got.trail)
		}
		if modes[i] != "fail" && (got.status != "SUCCEEDED" || !strings.HasPrefix(got.result, `{"echo":`)) {
			t.Errorf("%s task %s: %s with result %q, want SUCCEEDED with its echo", modes[i], id, got.status, got.result)
		}
	}
	sizes := rc.sizes()
	most := 0
	for _, s := range sizes {
		most = max(most, s)
	}
	if most > 4 || most < 2 {
		t.Errorf("POSTs of %v tasks: want at most 4, and some of more than one", sizes)
	}

	// A worker killed while its batch is out: the receiver holds the
	// request; a second worker takes the tasks over once their leases
	// expire (the abandoned run counts as an attempt) and finishes them.
	held := enqueueFile(t, bin, env,
		`{"kind":"e2e.hold","payload":{"n":1}}`, `{"kind":"e2e.hold","payload":{"n":2}}`, `{"kind":"e2e.hold","payload":{"n":3}}`)
	testenv.Eventually(t, time.Minute, "the held batch reached the receiver", func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		n := 0
		for _, b := range rc.batches {
			if b[0].Kind == "e2e.hold" {
				n += len(b)
			}
		}
		return n == 3
	})
	a.signal(syscall.SIGKILL)
	a.wait(30 * time.Second)
	b := start(t, bin, append(env, "INGEST_CONSUMER_NAME=batch-b"), "run")
	testenv.Eventually(t, time.Minute, "the held tasks ended", func() bool { b.mustBeRunning(); return ended(held)() })
	for _, id := range held {
		got := readTask(t, db.Pool, id)
		if got.status != "SUCCEEDED" || got.attempts != 1 || !strings.HasPrefix(got.trail, "QUEUED/0→RUNNING/0→RUNNING/1→SUCCEEDED/1") {
			t.Errorf("held task %s: %s, attempts %d, trail %s; want taken over and SUCCEEDED", id, got.status, got.attempts, got.trail)
		}
	}
	b.signal(syscall.SIGTERM)
	if code := b.wait(time.Minute); code != 0 {
		t.Errorf("worker b exited %d:\n%s", code, b.stderr.String())
	}
}
