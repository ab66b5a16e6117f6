package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/webhook"
)

// receiver is a webhook target recording what it was sent.
type receiver struct {
	mu   sync.Mutex
	seen map[uuid.UUID][]webhook.Request // by task id
	keys map[uuid.UUID][]string          // Idempotency-Key headers by task id
	// respond decides the answer; nil answers 200.
	respond func(w http.ResponseWriter, r *http.Request, req webhook.Request)
}

func newReceiver(t *testing.T, respond func(http.ResponseWriter, *http.Request, webhook.Request)) (*receiver, *httptest.Server) {
	rc := &receiver{seen: map[uuid.UUID][]webhook.Request{}, keys: map[uuid.UUID][]string{}, respond: respond}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req webhook.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("webhook body: %v", err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.seen[req.TaskID] = append(rc.seen[req.TaskID], req)
		rc.keys[req.TaskID] = append(rc.keys[req.TaskID], r.Header.Get("Idempotency-Key"))
		rc.mu.Unlock()
		if rc.respond != nil {
			rc.respond(w, r, req)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return rc, srv
}

func (rc *receiver) count(id uuid.UUID) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.seen[id])
}

func (rc *receiver) total() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, s := range rc.seen {
		n += len(s)
	}
	return n
}

// statusCounts counts tasks per status in db.
func statusCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT status, count(*) FROM ingest_task GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	return out
}

func apiCall(t *testing.T, method, url, token, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestBinary(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)

	t.Run("Help", func(t *testing.T) {
		t.Parallel()
		out := mustRun(t, bin, nil, "", "--help")
		for _, w := range []string{"demo", "run", "migrate", "enqueue", "task", "dlq", "pending", "--json", "Exit codes"} {
			if !strings.Contains(out, w) {
				t.Errorf("--help lacks %q", w)
			}
		}
		if r := runBin(t, bin, nil, "", "nonsense"); r.code != exitUsage {
			t.Errorf("unknown command: exit %d, want 2", r.code)
		}
		if r := runBin(t, bin, nil, "", "task", "show"); r.code != exitUsage {
			t.Errorf("task show without an id: exit %d, want 2", r.code)
		}
		if r := runBin(t, bin, nil, "", "task", "show", "not-a-uuid"); r.code != exitUsage {
			t.Errorf("task show with a bad id: exit %d, want 2", r.code)
		}
		if r := runBin(t, bin, nil, "", "task", "cancel", "not-a-uuid"); r.code != exitUsage {
			t.Errorf("task cancel with a bad id: exit %d, want 2", r.code)
		}
		if r := runBin(t, bin, nil, "", "healthcheck", "--http-addr", freeAddr(t)); r.code != exitRuntime {
			t.Errorf("healthcheck with nothing listening: exit %d, want 1", r.code)
		}
		if r := runBin(t, bin, nil, "", "enqueue", "--kind", "k"); r.code != exitUsage || !strings.Contains(r.stderr, "--payload") {
			t.Errorf("enqueue without a payload: exit %d %s, want 2", r.code, r.stderr)
		}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--run-at", "2030-01-01T00:00:00Z", "--delay", "1s"}, "exclusive"},
			{[]string{"--run-at", "tomorrow"}, "--run-at"},
			{[]string{"--delay", "-1s"}, "--delay"},
			{[]string{"--timeout", "0s"}, "--timeout"},
		} {
			args := append([]string{"enqueue", "--kind", "k", "--payload", "1"}, c.args...)
			if r := runBin(t, bin, nil, "", args...); r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
				t.Errorf("%v: exit %d %s, want 2 naming %s", c.args, r.code, r.stderr, c.want)
			}
		}
	})

	t.Run("ConfigErrorsExit2", func(t *testing.T) {
		t.Parallel()
		const pw = "pw-Secret-42"
		base := []string{"INGEST_WEBHOOK_URL=http://127.0.0.1:1/hook", "INGEST_DATABASE_URL=postgres://app:" + pw + "@127.0.0.1:1/x"}
		for _, tt := range []struct {
			env  string
			args []string
			want string
		}{
			{env: "INGEST_WORKER_CONCURRENCY=lots", want: "INGEST_WORKER_CONCURRENCY"},
			{env: "INGEST_REDIS_RECLAIM_IDLE_MS=-1", want: "INGEST_REDIS_RECLAIM_IDLE_MS"},
			{env: "INGEST_REDIS_RETRY_MAX_BACKOFF_MS=500", want: "INGEST_REDIS_RETRY_BASE_BACKOFF_MS"},
			{env: "INGEST_REDIS_URL=localhost:6379", want: "INGEST_REDIS_URL"},
			{env: "INGEST_TASK_LEASE_MS=abc", want: "INGEST_TASK_LEASE_MS"},
			{env: "INGEST_OUTBOX_PUBLISH_BATCH_SIZE=0", want: "INGEST_OUTBOX_PUBLISH_BATCH_SIZE"},
			{env: "INGEST_WEBHOOK_URL=mailto:x@y", want: "INGEST_WEBHOOK_URL"},
			{env: "INGEST_DATABASE_URL=postgres://app:" + pw + "@db:port/x", want: "INGEST_DATABASE_URL"},
			{env: "INGEST_LOG_LEVEL=loud", want: "INGEST_LOG_LEVEL"},
			{args: []string{"--redis-reclaim-interval-ms=soon"}, want: "INGEST_REDIS_RECLAIM_INTERVAL_MS"},
			{args: []string{"--no-such-flag"}, want: "unknown flag"},
		} {
			env := append(append([]string{}, base...), tt.env)
			r := runBin(t, bin, env, "", append([]string{"run"}, tt.args...)...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
				t.Errorf("run with %s %v: exit %d, stderr %q; want 2 naming %s", tt.env, tt.args, r.code, r.stderr, tt.want)
			}
			if strings.Contains(r.stdout+r.stderr, pw) {
				t.Errorf("run with %s: the password appears in the output:\n%s%s", tt.env, r.stdout, r.stderr)
			}
		}
	})

	t.Run("Periodic", func(t *testing.T) {
		t.Parallel()
		env := []string{`INGEST_PERIODIC=[{"kind":"sync","every":"30s"},{"name":"nightly","kind":"report","cron":"0 3 * * *"}]`}
		var out struct {
			Schedules []struct {
				Name           string    `json:"name"`
				Kind           string    `json:"kind"`
				IdempotencyKey string    `json:"idempotency_key"`
				NextSlot       time.Time `json:"next_slot"`
			} `json:"schedules"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "periodic", "--json")), &out); err != nil {
			t.Fatal(err)
		}
		if len(out.Schedules) != 2 || out.Schedules[0].Kind != "sync" || out.Schedules[0].NextSlot.Unix()%30 != 0 ||
			out.Schedules[1].NextSlot.UTC().Hour() != 3 || !strings.HasPrefix(out.Schedules[1].IdempotencyKey, "periodic:nightly:") {
			t.Fatalf("periodic --json = %+v", out)
		}
		if r := runBin(t, bin, []string{`INGEST_PERIODIC=[{"kind":"x","every":"soon"}]`}, "", "periodic"); r.code != exitUsage || !strings.Contains(r.stderr, "INGEST_PERIODIC") {
			t.Fatalf("a bad schedule: exit %d %q, want 2 naming INGEST_PERIODIC", r.code, r.stderr)
		}
	})

	t.Run("NoHandlerExit2", func(t *testing.T) {
		t.Parallel()
		r := runBin(t, bin, nil, "", "run")
		if r.code != exitUsage || !strings.Contains(r.stderr, "INGEST_WEBHOOK_URL") || !strings.Contains(r.stderr, "demo") {
			t.Fatalf("run without a handler: exit %d, stderr %q; want 2 explaining the choices", r.code, r.stderr)
		}
	})

	t.Run("PasswordNeverShown", func(t *testing.T) {
		t.Parallel()
		const pw = "pw-Secret-77"
		env := []string{"INGEST_DATABASE_URL=postgres://app:" + pw + "@127.0.0.1:1/x?connect_timeout=2", "INGEST_REDIS_URL=redis://:" + pw + "@127.0.0.1:1/0",
			"INGEST_API_TOKEN=" + pw + "-token", "INGEST_LOG_LEVEL=debug"}
		for _, args := range [][]string{{"migrate"}, {"task", "list"}, {"pending"}, {"config"}, {"config", "--json"}, {"dlq", "list"},
			{"run", "--webhook-url", "http://u:" + pw + "@127.0.0.1:1/x"}} {
			r := runBin(t, bin, env, "", args...)
			if strings.Contains(r.stdout+r.stderr, pw) {
				t.Errorf("%v shows the secret:\n%s%s", args, r.stdout, r.stderr)
			}
			if args[0] != "config" && r.code != exitRuntime {
				t.Errorf("%v against unreachable servers: exit %d, want 1\n%s", args, r.code, r.stderr)
			}
		}
	})

	t.Run("PostgresSSLModePassesThrough", func(t *testing.T) {
		t.Parallel()
		// Against a server without SSL, sslmode=require must reach the
		// driver (and fail on it), sslmode=disable must connect. The test
		// server may have SSL on (a distribution's packaged PostgreSQL
		// often has, with a self-signed certificate): then a throwaway
		// server of its own, which has none.
		db := testenv.NewDatabase(t)
		url := db.URL
		if sslOn(t, db.Pool) {
			srv, err := pgtemp.Start()
			if err != nil {
				t.Fatalf("the test server has SSL on, and a server without it did not start: %v", err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			url = srv.URL("postgres")
		}
		require := strings.Replace(url, "sslmode=disable", "sslmode=require", 1)
		if require == url {
			t.Fatalf("test URL %q has no sslmode=disable to replace", url)
		}
		r := runBin(t, bin, []string{"INGEST_DATABASE_URL=" + require}, "", "migrate", "--status")
		if r.code != exitRuntime || !strings.Contains(strings.ToLower(r.stderr), "ssl") {
			t.Errorf("sslmode=require against a server without SSL: exit %d, stderr %q; want exit 1 naming SSL", r.code, r.stderr)
		}
		if r := runBin(t, bin, []string{"INGEST_DATABASE_URL=" + url}, "", "migrate", "--status"); r.code != 0 {
			t.Errorf("sslmode=disable: exit %d, stderr %q", r.code, r.stderr)
		}
	})

	t.Run("MigrateTwiceAndStaleSchema", func(t *testing.T) {
		t.Parallel()
		db := testenv.NewEmptyDatabase(t)
		env := []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t), "INGEST_WEBHOOK_URL=http://127.0.0.1:1/x", "INGEST_HTTP_ADDR="}

		r := runBin(t, bin, env, "", "run")
		if r.code == 0 || !strings.Contains(r.stderr, "ingest-worker migrate") {
			t.Fatalf("run on an empty database: exit %d, stderr %q; want a failure saying to run ingest-worker migrate", r.code, r.stderr)
		}
		var st struct {
			UpToDate bool    `json:"up_to_date"`
			Pending  []int64 `json:"pending"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "migrate", "--status", "--json")), &st); err != nil || st.UpToDate || len(st.Pending) == 0 {
			t.Fatalf("status of an empty database: %+v %v", st, err)
		}
		if out := mustRun(t, bin, env, "", "migrate"); !strings.Contains(out, "applied migration") {
			t.Fatalf("first migrate: %q", out)
		}
		if out := mustRun(t, bin, env, "", "migrate"); !strings.Contains(out, "nothing to apply") {
			t.Fatalf("second migrate: %q, want a no-op", out)
		}
		if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "migrate", "--status", "--json")), &st); err != nil || !st.UpToDate {
			t.Fatalf("status after migrate: %+v %v", st, err)
		}
	})

	t.Run("EndToEnd", func(t *testing.T) { t.Parallel(); testEndToEnd(t, bin) })
	t.Run("SigtermDuringWork", func(t *testing.T) { t.Parallel(); testSigterm(t, bin) })
	t.Run("Demo", func(t *testing.T) { t.Parallel(); testDemo(t, bin, true) })
	t.Run("DemoZeroSetup", func(t *testing.T) { t.Parallel(); testDemo(t, bin, false) })
	t.Run("DemoKafka", func(t *testing.T) { t.Parallel(); testDemoKafka(t, bin) })
}

func testEndToEnd(t *testing.T, bin string) {
	ctx := context.Background()
	db := testenv.NewEmptyDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	rc, hook := newReceiver(t, func(w http.ResponseWriter, r *http.Request, req webhook.Request) {
		if req.Kind == "e2e.hang" { // until the worker gives up the request
			<-r.Context().Done()
			return
		}
		if req.Kind == "e2e.reject" {
			http.Error(w, "no such account", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	addr := freeAddr(t)
	const token = "e2e-api-token-123"
	redisURL := testenv.RedisURL(t)
	env := []string{
		"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + redisURL,
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_WEBHOOK_URL=" + hook.URL + "/hook", "INGEST_API_TOKEN=" + token,
		"INGEST_CONSUMER_NAME=e2e-" + uuid.NewString()[:8], "INGEST_LOG_LEVEL=debug", "INGEST_WORKER_CONCURRENCY=4",
	}

	mustRun(t, bin, env, "", "migrate")
	if out := mustRun(t, bin, env, "", "migrate"); !strings.Contains(out, "nothing to apply") {
		t.Fatalf("second migrate: %q", out)
	}
	worker := start(t, bin, env, "run", "--http-addr", addr)
	waitReady(t, worker, addr)
	base := "http://" + addr
	if out := mustRun(t, bin, env, "", "healthcheck", "--ready", "--http-addr", addr); !strings.Contains(out, "ready") {
		t.Fatalf("healthcheck --ready: %q", out)
	}

	var ids []uuid.UUID
	// Over the HTTP API: single, idempotent repeat, batch.
	if code, _ := apiCall(t, "POST", base+"/v1/tasks", "", `{"kind":"e2e.api","payload":{}}`); code != http.StatusUnauthorized {
		t.Fatalf("create without the token: %d, want 401", code)
	}
	code, body := apiCall(t, "POST", base+"/v1/tasks", token, `{"kind":"e2e.api","payload":{"n":1},"idempotency_key":"api-1"}`)
	var created api.CreateResponse
	if code != http.StatusCreated || json.Unmarshal(body, &created) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	ids = append(ids, created.ID)
	code, body = apiCall(t, "POST", base+"/v1/tasks", token, `{"kind":"e2e.api","payload":{"n":1},"idempotency_key":"api-1"}`)
	if code != http.StatusOK || !strings.Contains(string(body), created.ID.String()) {
		t.Fatalf("repeated create: %d %s, want 200 with %s", code, body, created.ID)
	}
	code, body = apiCall(t, "POST", base+"/v1/tasks:batch", token, `[{"kind":"e2e.batch","payload":1},{"kind":"e2e.batch","payload":2},{"kind":"e2e.batch","payload":3,"max_attempts":2}]`)
	var batch api.BatchResponse
	if code != http.StatusCreated || json.Unmarshal(body, &batch) != nil || len(batch.Tasks) != 3 {
		t.Fatalf("batch: %d %s", code, body)
	}
	for _, c := range batch.Tasks {
		ids = append(ids, c.ID)
	}

	// Over the CLI: inline, @file, --file.
	dir := t.TempDir()
	payloadFile := filepath.Join(dir, "payload.json")
	os.WriteFile(payloadFile, []byte(`{"from":"file"}`), 0o644)
	ndjson := filepath.Join(dir, "tasks.ndjson")
	os.WriteFile(ndjson, []byte("{\"kind\":\"e2e.file\",\"payload\":{\"n\":1}}\n\n{\"kind\":\"e2e.file\",\"payload\":[2],\"idempotency_key\":\"f2\",\"max_attempts\":3}\n{\"kind\":\"e2e.file\",\"payload\":\"three\"}\n"), 0o644)
	for _, args := range [][]string{
		{"enqueue", "--kind", "e2e.cli", "--payload", `{"n": 1}`},
		{"enqueue", "--kind", "e2e.cli", "--payload", "@" + payloadFile, "--idempotency-key", "cli-2", "--max-attempts", "4"},
		{"enqueue", "--file", ndjson},
		{"enqueue", "--kind", "e2e.cli", "--payload", "3", "--delay", "500ms", "--timeout", "30s"},
	} {
		for _, line := range strings.Fields(mustRun(t, bin, env, "", args...)) {
			id, err := uuid.Parse(line)
			if err != nil {
				t.Fatalf("%v printed %q, want task ids", args, line)
			}
			ids = append(ids, id)
		}
	}
	stdinID := strings.TrimSpace(mustRun(t, bin, env, `{"from":"stdin"}`, "enqueue", "--kind", "e2e.cli", "--payload", "@-"))
	ids = append(ids, uuid.MustParse(stdinID))
	if len(ids) != 11 {
		t.Fatalf("enqueued %d tasks, want 11", len(ids))
	}
	// A bad line rejects the whole file, nothing created.
	bad := filepath.Join(dir, "bad.ndjson")
	os.WriteFile(bad, []byte("{\"kind\":\"e2e.bad\",\"payload\":1}\n{\"kind\":\"e2e.bad\"}\n"), 0o644)
	if r := runBin(t, bin, env, "", "enqueue", "--file", bad); r.code != exitUsage || !strings.Contains(r.stderr, "line 2") {
		t.Fatalf("bad file: exit %d %q, want 2 naming line 2", r.code, r.stderr)
	}

	testenv.Eventually(t, 30*time.Second, "every task SUCCEEDED", func() bool {
		worker.mustBeRunning()
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE id = ANY($1) AND status = 'SUCCEEDED'`, ids).Scan(&n)
		return n == len(ids)
	})
	if c := statusCounts(t, db.Pool); c["SUCCEEDED"] != len(ids) || len(c) != 1 {
		t.Fatalf("tasks by status %v, want %d SUCCEEDED and nothing else", c, len(ids))
	}
	rc.mu.Lock()
	for _, id := range ids {
		if len(rc.seen[id]) == 0 {
			t.Errorf("the webhook never saw task %s", id)
		}
		for _, k := range rc.keys[id] {
			if k != id.String() {
				t.Errorf("task %s was sent with Idempotency-Key %q", id, k)
			}
		}
	}
	rc.mu.Unlock()

	// Inspection.
	var show taskDetail
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "task", "show", ids[0].String(), "--json")), &show); err != nil {
		t.Fatal(err)
	}
	if show.Task.Status != "SUCCEEDED" || len(show.Transitions) < 3 || len(show.Redis.Entries) == 0 || show.Redis.Entries[0].Pending || show.Redis.Error != "" {
		t.Fatalf("task show: %+v", show)
	}
	if out := mustRun(t, bin, env, "", "task", "show", ids[0].String()); !strings.Contains(out, "TRANSITIONS") || !strings.Contains(out, "SUCCEEDED") {
		t.Fatalf("task show (table):\n%s", out)
	}
	if r := runBin(t, bin, env, "", "task", "show", uuid.NewString()); r.code != exitRuntime || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("task show of an unknown id: exit %d %q", r.code, r.stderr)
	}
	var list struct {
		Tasks []struct{ ID uuid.UUID } `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "task", "list", "--status", "succeeded", "--kind", "e2e.file", "--json")), &list); err != nil || len(list.Tasks) != 3 {
		t.Fatalf("task list: %+v %v", list, err)
	}
	// The stream length pending reports is XLEN's; the leader's retention
	// may trim acknowledged entries at any time, so it is bracketed by
	// XLEN before and after.
	rdb := testenv.Client(t, redisURL)
	before, err := rdb.XLen(ctx, stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	var pend pendingReport
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "pending", "--json")), &pend); err != nil {
		t.Fatal(err)
	}
	after, err := rdb.XLen(ctx, stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !pend.GroupExists || pend.Pending != 0 || pend.Outbox.Backlog != 0 || pend.StreamLength > before || pend.StreamLength < after ||
		pend.Tasks["SUCCEEDED"] != int64(len(ids)) {
		t.Fatalf("pending: %+v (XLEN %d before, %d after)", pend, before, after)
	}
	if len(pend.PriorityStreams) != 3 || pend.PriorityStreams[0].Priority != 1 || pend.PriorityStreams[0].Stream != stream+":p1" {
		t.Fatalf("pending: priority streams %+v, want those of priorities 1, 3 and 4", pend.PriorityStreams)
	}

	// A 400 from the webhook is permanent: DEAD at once, in the DLQ; replay
	// redrives it (and it dies again).
	rejectID := uuid.MustParse(strings.TrimSpace(mustRun(t, bin, env, "", "enqueue", "--kind", "e2e.reject", "--payload", "{}")))
	dlqHas := func() (string, bool) {
		var l struct {
			Entries []struct {
				ID     string `json:"id"`
				TaskID string `json:"task_id"`
			} `json:"entries"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "dlq", "list", "--json")), &l); err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Entries {
			if e.TaskID == rejectID.String() {
				return e.ID, true
			}
		}
		return "", false
	}
	var entry string
	testenv.Eventually(t, 20*time.Second, "the rejected task in the DLQ", func() bool { var ok bool; entry, ok = dlqHas(); return ok })
	if rc.count(rejectID) != 1 {
		t.Fatalf("a permanent failure was sent %d times, want once", rc.count(rejectID))
	}
	var replay struct {
		Results []struct{ Outcome string } `json:"results"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "dlq", "replay", entry, "--json")), &replay); err != nil || len(replay.Results) != 1 || replay.Results[0].Outcome != "replayed" {
		t.Fatalf("dlq replay: %+v %v", replay, err)
	}
	testenv.Eventually(t, 20*time.Second, "the replayed task to run again", func() bool { return rc.count(rejectID) == 2 })

	// task redrive by filter: it died again (a new DLQ entry); a dry run
	// names it and changes nothing, the redrive runs it a third time and
	// removes its DLQ entry.
	testenv.Eventually(t, 20*time.Second, "the second death in the DLQ", func() bool { _, ok := dlqHas(); return ok })
	var bulk struct {
		Matched, Redriven int
		IDs               []uuid.UUID `json:"ids"`
		DLQRemoved        int         `json:"dlq_removed"`
	}
	filter := []string{"task", "redrive", "--status", "dead", "--kind", "e2e.reject", "--error-contains", "400 Bad Request", "--json"}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", append(filter, "--dry-run")...)), &bulk); err != nil ||
		bulk.Matched != 1 || bulk.Redriven != 0 || len(bulk.IDs) != 1 || bulk.IDs[0] != rejectID {
		t.Fatalf("task redrive --dry-run: %+v %v; want task %s matched, nothing redriven", bulk, err, rejectID)
	}
	if _, ok := dlqHas(); !ok || rc.count(rejectID) != 2 {
		t.Fatalf("the dry run changed something: DLQ entry %v, webhook calls %d", ok, rc.count(rejectID))
	}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", filter...)), &bulk); err != nil ||
		bulk.Matched != 1 || bulk.Redriven != 1 || bulk.DLQRemoved != 1 {
		t.Fatalf("task redrive: %+v %v; want 1 matched, redriven and removed from the DLQ", bulk, err)
	}
	testenv.Eventually(t, 20*time.Second, "the redriven task to run a third time", func() bool { return rc.count(rejectID) == 3 })

	// kind pause / list / resume (the parking itself: pause_test.go).
	if out := mustRun(t, bin, env, "", "kind", "pause", "e2e.reject"); !strings.Contains(out, "kind e2e.reject paused") {
		t.Fatalf("kind pause: %q", out)
	}
	var kinds struct {
		Kinds []struct {
			Kind      string           `json:"kind"`
			Paused    bool             `json:"paused"`
			UpdatedBy string           `json:"updated_by"`
			Counts    map[string]int64 `json:"counts"`
		} `json:"kinds"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "kind", "list", "--json")), &kinds); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, k := range kinds.Kinds {
		if k.Kind == "e2e.reject" {
			found = k.Paused && strings.HasPrefix(k.UpdatedBy, "cli:") && k.Counts["DEAD"]+k.Counts["RUNNING"]+k.Counts["QUEUED"] == 1
		}
	}
	if !found {
		t.Fatalf("kind list: %+v; want e2e.reject paused by the CLI with its one task", kinds)
	}
	if out := mustRun(t, bin, env, "", "kind", "resume", "e2e.reject"); !strings.Contains(out, "kind e2e.reject resumed") {
		t.Fatalf("kind resume: %q", out)
	}
	if r := runBin(t, bin, env, "", "kind", "pause", " "); r.code != exitUsage || !strings.Contains(r.stderr, "kind is empty") {
		t.Fatalf("kind pause of a blank kind: exit %d, stderr %q; want a usage error", r.code, r.stderr)
	}
	// kind set: limits, shown by kind list; a bad rate is a usage error
	// naming it.
	if out := mustRun(t, bin, env, "", "kind", "set", "e2e.limited", "--force", "--concurrency", "2", "--rate", "300/m"); !strings.Contains(out, "concurrency 2, rate 300/m") {
		t.Fatalf("kind set: %q", out)
	}
	if out := mustRun(t, bin, env, "", "kind", "list"); !strings.Contains(out, "e2e.limited") || !strings.Contains(out, "300/m") {
		t.Fatalf("kind list after kind set: %q", out)
	}
	if out := mustRun(t, bin, env, "", "kind", "set", "e2e.limited", "--rate", "0"); !strings.Contains(out, "concurrency 2, rate no limit") {
		t.Fatalf("kind set --rate 0: %q", out)
	}
	if r := runBin(t, bin, env, "", "kind", "set", "e2e.limited", "--rate", "5/fortnight"); r.code != exitUsage || !strings.Contains(r.stderr, "5/fortnight") {
		t.Fatalf("kind set --rate 5/fortnight: exit %d, stderr %q; want a usage error naming the rate", r.code, r.stderr)
	}
	if out := mustRun(t, bin, env, "", "kind", "set", "e2e.limited", "--concurrency-per-group", "3", "--rate-per-group", "2/s"); !strings.Contains(out, "per group: concurrency 3, rate 2/s, window 100 (default)") {
		t.Fatalf("kind set --concurrency-per-group 3 --rate-per-group 2/s: %q", out)
	}
	if r := runBin(t, bin, env, "", "kind", "set", "e2e.limited", "--rate-per-group", "2/fortnight"); r.code != exitUsage || !strings.Contains(r.stderr, "--rate-per-group") {
		t.Fatalf("kind set --rate-per-group 2/fortnight: exit %d, stderr %q; want a usage error naming the flag", r.code, r.stderr)
	}
	if out := mustRun(t, bin, env, "", "kind", "set", "e2e.limited", "--concurrency-per-group", "0", "--rate-per-group", "0"); strings.Contains(out, "per group") {
		t.Fatalf("kind set removing the per-group limits: %q", out)
	}
	if r := runBin(t, bin, env, "", "kind", "set", "e2e.limited"); r.code != exitUsage || !strings.Contains(r.stderr, "--concurrency, --rate") {
		t.Fatalf("kind set without a limit: exit %d, stderr %q; want a usage error", r.code, r.stderr)
	}
	// kind set --sequence-on-failure; kind blocked; enqueue --sequence-key
	// (the order itself: sequence_test.go).
	if out := mustRun(t, bin, env, "", "kind", "set", "e2e.seq", "--force", "--sequence-on-failure", "continue"); !strings.Contains(out, "sequence on failure continue") {
		t.Fatalf("kind set --sequence-on-failure continue: %q", out)
	}
	if r := runBin(t, bin, env, "", "kind", "set", "e2e.seq", "--sequence-on-failure", "skip"); r.code != exitUsage || !strings.Contains(r.stderr, "sequence_on_failure") {
		t.Fatalf("kind set --sequence-on-failure skip: exit %d, stderr %q; want a usage error naming it", r.code, r.stderr)
	}
	var seqTask taskDetail
	for no := int64(1); no <= 2; no++ {
		id := strings.TrimSpace(mustRun(t, bin, env, "", "enqueue", "--kind", "e2e.seq", "--payload", "{}", "--sequence-key", "doc-1", "--delay", "1h"))
		if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "task", "show", id, "--json")), &seqTask); err != nil ||
			seqTask.Task.SequenceKey != "doc-1" || seqTask.Task.SequenceNo == nil || *seqTask.Task.SequenceNo != no {
			t.Fatalf("task show of sequenced task %d: %+v, %v", no, seqTask.Task, err)
		}
	}
	if out := mustRun(t, bin, env, "", "kind", "blocked", "e2e.seq", "--json"); !strings.Contains(out, `"sequences": []`) {
		t.Fatalf("kind blocked: %q; want no sequences", out)
	}
	if r := runBin(t, bin, env, "", "task", "redrive", "--status", "RUNNING"); r.code != exitUsage || !strings.Contains(r.stderr, "status must be DEAD or CANCELLED") {
		t.Fatalf("task redrive --status RUNNING: exit %d, stderr %q; want a usage error naming the status", r.code, r.stderr)
	}

	// A run_at beyond the scheduling horizon is a usage error naming it.
	if r := runBin(t, bin, env, "", "enqueue", "--kind", "e2e.parked", "--payload", "{}", "--run-at", "9999-12-31T00:00:00Z"); r.code != exitUsage ||
		!strings.Contains(r.stderr, "run_at") || !strings.Contains(r.stderr, "scheduling horizon") {
		t.Fatalf("enqueue --run-at 9999-12-31: exit %d, stderr %q; want a usage error naming run_at and the horizon", r.code, r.stderr)
	}

	// A parked task: task show and task list say why it waits and show no
	// far-future time, and the resume runs it. (The worker parks a paused
	// kind's entries once it has read the pause, within a second; here the
	// store parks the task, so that the test does not race that read: it
	// is created an hour ahead, so that no worker reads it first, and made
	// due by SQL.)
	mustRun(t, bin, env, "", "kind", "pause", "e2e.parked", "--force")
	parkedID := uuid.MustParse(strings.TrimSpace(mustRun(t, bin, env, "", "enqueue", "--kind", "e2e.parked", "--payload", "{}", "--delay", "1h")))
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE ingest_task SET next_retry_at = NULL WHERE id = $1`, parkedID); err != nil {
		t.Fatal(err)
	}
	if parked, err := store.Park(ctx, parkedID); err != nil || len(parked) != 1 {
		t.Fatalf("Park = %v, %v", parked, err)
	}
	for _, args := range [][]string{{"task", "show", parkedID.String()}, {"task", "list", "--kind", "e2e.parked"}} {
		out := mustRun(t, bin, env, "", args...)
		if !strings.Contains(out, "parked (kind paused)") || strings.Contains(out, "9999") || strings.Contains(out, "106751d") {
			t.Fatalf("%v of a parked task:\n%s", args, out)
		}
	}
	if out := mustRun(t, bin, env, "", "kind", "resume", "e2e.parked"); !strings.Contains(out, "1 parked task published again") {
		t.Fatalf("kind resume e2e.parked: %q", out)
	}
	testenv.Eventually(t, 20*time.Second, "the released task to run", func() bool { return rc.count(parkedID) == 1 })

	// task cancel: a running task's webhook call is cut off and the task
	// ends CANCELLED, audited with the reason and the CLI as the actor.
	hangID := uuid.MustParse(strings.TrimSpace(mustRun(t, bin, env, "", "enqueue", "--kind", "e2e.hang", "--payload", "{}")))
	testenv.Eventually(t, 20*time.Second, "the hanging task's webhook call", func() bool { return rc.count(hangID) == 1 })
	if out := mustRun(t, bin, env, "", "task", "cancel", hangID.String(), "--reason", "e2e says stop"); !strings.Contains(out, "cancel requested") {
		t.Fatalf("task cancel of a running task: %q", out)
	}
	var shown struct {
		Task        struct{ Status string } `json:"task"`
		Transitions []struct {
			To      string `json:"to_status"`
			Worker  string `json:"worker"`
			Message string `json:"message"`
		} `json:"transitions"`
		Redis struct{ Entries []struct{ Pending bool } } `json:"redis"`
	}
	testenv.Eventually(t, 10*time.Second, "the cancelled task CANCELLED", func() bool {
		if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "task", "show", hangID.String(), "--json")), &shown); err != nil {
			t.Fatal(err)
		}
		return shown.Task.Status == "CANCELLED" && len(shown.Redis.Entries) == 1 && !shown.Redis.Entries[0].Pending
	})
	if last := shown.Transitions[len(shown.Transitions)-1]; last.To != "CANCELLED" || !strings.HasPrefix(last.Worker, "cli:") || last.Message != "cancelled: e2e says stop" {
		t.Fatalf("audit row of the cancel: %+v", last)
	}
	if r := runBin(t, bin, env, "", "task", "cancel", hangID.String()); r.code != exitRuntime || !strings.Contains(r.stderr, "CANCELLED") {
		t.Fatalf("task cancel of a CANCELLED task: exit %d %s, want 1", r.code, r.stderr)
	}
	// Over the API: a queued task is cancelled at once (200), a terminal one is 409.
	code, body = apiCall(t, "POST", base+"/v1/tasks/"+hangID.String()+"/cancel", token, "")
	if code != http.StatusConflict {
		t.Fatalf("API cancel of a CANCELLED task: %d %s, want 409", code, body)
	}

	worker.signal(syscall.SIGTERM)
	if code := worker.wait(15 * time.Second); code != 0 {
		t.Fatalf("run exited %d after SIGTERM:\n%s", code, worker.stderr.String())
	}
	if strings.Contains(worker.stderr.String()+worker.stdout.String(), token) {
		t.Fatal("the worker's output shows the API token")
	}
}

func testSigterm(t *testing.T, bin string) {
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	rc, hook := newReceiver(t, func(w http.ResponseWriter, r *http.Request, req webhook.Request) {
		if req.Kind == "slow" {
			select { // a run that outlasts the shutdown grace period
			case <-release:
			case <-r.Context().Done():
				return
			}
		} else {
			time.Sleep(50 * time.Millisecond) // simulated work
		}
		w.WriteHeader(http.StatusOK)
	})
	const shutdownTimeout = 1500 * time.Millisecond
	env := []string{
		"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_WEBHOOK_URL=" + hook.URL, "INGEST_WORKER_CONCURRENCY=4", "INGEST_HTTP_ADDR=",
		fmt.Sprintf("INGEST_SHUTDOWN_TIMEOUT_MS=%d", shutdownTimeout.Milliseconds()),
		"INGEST_REDIS_RECLAIM_INTERVAL_MS=200", "INGEST_REDIS_RECLAIM_IDLE_MS=10000", "INGEST_TASK_LEASE_MS=3000",
	}
	var lines strings.Builder
	for i := range 40 {
		fmt.Fprintf(&lines, "{\"kind\":\"normal\",\"payload\":%d}\n", i)
	}
	lines.WriteString("{\"kind\":\"slow\",\"payload\":1}\n{\"kind\":\"slow\",\"payload\":2}\n")
	var ids []uuid.UUID
	for _, l := range strings.Fields(mustRun(t, bin, env, lines.String(), "enqueue", "--file", "-")) {
		ids = append(ids, uuid.MustParse(l))
	}
	slow := ids[40:]

	first := start(t, bin, append(env, "INGEST_CONSUMER_NAME=first"), "run")
	testenv.Eventually(t, 30*time.Second, "work in flight, both slow tasks running", func() bool {
		first.mustBeRunning()
		return rc.count(slow[0]) > 0 && rc.count(slow[1]) > 0 && rc.total() >= 6
	})
	sent := time.Now()
	first.signal(syscall.SIGTERM)
	// The slow runs never end on their own: the process exits only because
	// the grace period cut them off (the deadline only bounds a hang).
	code := first.wait(shutdownTimeout + 30*time.Second)
	took := time.Since(sent)
	if code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, first.stderr.String())
	}
	t.Logf("shutdown took %s, the grace period is %s", took, shutdownTimeout)
	var dead, running int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'DEAD'), count(*) FILTER (WHERE status = 'RUNNING') FROM ingest_task`).Scan(&dead, &running); err != nil {
		t.Fatal(err)
	}
	if dead != 0 || running != 0 {
		t.Fatalf("after a graceful shutdown: %d DEAD, %d RUNNING; want none (the cut-off runs handed back)", dead, running)
	}
	var slowAttempts int
	if err := db.Pool.QueryRow(ctx, `SELECT sum(attempt_count) FROM ingest_task WHERE id = ANY($1)`, slow).Scan(&slowAttempts); err != nil {
		t.Fatal(err)
	}
	if slowAttempts != 0 {
		t.Fatalf("the runs cut off by shutdown counted %d failed attempts, want 0", slowAttempts)
	}

	releaseOnce.Do(func() { close(release) })
	second := start(t, bin, append(env, "INGEST_CONSUMER_NAME=second"), "run")
	testenv.Eventually(t, 40*time.Second, "every task SUCCEEDED after the second run", func() bool {
		second.mustBeRunning()
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE status = 'SUCCEEDED'`).Scan(&n)
		return n == len(ids)
	})
	second.signal(syscall.SIGTERM)
	if code := second.wait(shutdownTimeout + 10*time.Second); code != 0 {
		t.Fatalf("second run: exit %d\n%s", code, second.stderr.String())
	}
	for _, id := range ids {
		if rc.count(id) == 0 {
			t.Errorf("task %s never reached the webhook", id)
		}
	}
}

func testDemo(t *testing.T, bin string, withDatabase bool) {
	env := []string{}
	var db *testenv.Database
	if withDatabase {
		db = testenv.NewEmptyDatabase(t)
		env = append(env, "INGEST_DATABASE_URL="+db.URL)
	}
	started := time.Now()
	r := runBin(t, bin, env, "", "demo", "--json")
	took := time.Since(started)
	if r.code != 0 {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if took > 3*time.Minute {
		t.Fatalf("demo took %s, want under 3 min", took)
	}
	t.Logf("demo took %s", took)
	var sum demoSummary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatalf("demo --json output: %v\n%s", err, r.stdout)
	}
	wantOK, wantDead := demoOK+demoFlaky, demoBroken+1
	if sum.Tasks != wantOK+wantDead || sum.ByStatus["SUCCEEDED"] != wantOK || sum.ByStatus["DEAD"] != wantDead || len(sum.DLQ) != wantDead {
		t.Fatalf("demo summary %+v: want %d SUCCEEDED, %d DEAD and %d DLQ entries", sum, wantOK, wantDead, wantDead)
	}
	if sum.FailedAttempts != demoFlaky/2*1+demoFlaky/2*2+demoBroken*3+1 {
		t.Errorf("failed attempts %d", sum.FailedAttempts)
	}
	if len(sum.Commands) == 0 || !strings.Contains(strings.Join(sum.Commands, "\n"), "redis-cli -p ") {
		t.Errorf("demo commands %q lack redis-cli", sum.Commands)
	}
	// The dashboard's address is printed, and the inspection commands
	// show data: not XRANGE of the task stream, which retention empties
	// once every entry is acknowledged, but XINFO STREAM and the DLQ.
	if sum.HTTPAddr == "" || !strings.Contains(r.stderr, "dashboard:  http://"+sum.HTTPAddr+"/ui/") ||
		!strings.Contains(strings.Join(sum.Commands, "\n"), "http://"+sum.HTTPAddr+"/ui/") {
		t.Errorf("demo does not print the dashboard's URL (http addr %q)\nstderr:\n%s\ncommands: %q", sum.HTTPAddr, r.stderr, sum.Commands)
	}
	joined := strings.Join(sum.Commands, "\n")
	if strings.Contains(joined, "XRANGE "+stream.DefaultStream+" ") || !strings.Contains(joined, "XINFO STREAM "+stream.DefaultStream) ||
		!strings.Contains(joined, "XRANGE "+dlq.DefaultStream+" ") {
		t.Errorf("demo commands %q: want XINFO STREAM of the task stream and XRANGE of the DLQ, not XRANGE of the (trimmed) task stream", sum.Commands)
	}
	if !withDatabase {
		return
	}
	// The summary matches the database.
	rows, err := db.Pool.Query(context.Background(), `SELECT status, count(*) FROM ingest_task WHERE kind LIKE 'demo.%' GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		got[s] = n
	}
	rows.Close()
	for s, n := range sum.ByStatus {
		if got[s] != n {
			t.Errorf("status %s: summary %d, database %d", s, n, got[s])
		}
	}
	var transitions int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ingest_task_transition`).Scan(&transitions); err != nil || transitions < sum.Tasks*3 {
		t.Errorf("%d transitions recorded for %d tasks (%v)", transitions, sum.Tasks, err)
	}
}

// testDemoKafka: `demo --queue kafka` runs the script on an in-process
// Kafka cluster with the same outcome as on Redis, the DLQ entries read
// back from the DLQ topic; and `pending` shows the group's lag.
func testDemoKafka(t *testing.T, bin string) {
	db := testenv.NewEmptyDatabase(t)
	r := runBin(t, bin, []string{"INGEST_DATABASE_URL=" + db.URL}, "", "demo", "--queue", "kafka", "--json")
	if r.code != 0 {
		t.Fatalf("demo --queue kafka: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	var sum demoSummary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatalf("demo --json output: %v\n%s", err, r.stdout)
	}
	wantOK, wantDead := demoOK+demoFlaky, demoBroken+1
	if sum.Tasks != wantOK+wantDead || sum.ByStatus["SUCCEEDED"] != wantOK || sum.ByStatus["DEAD"] != wantDead || len(sum.DLQ) != wantDead {
		t.Fatalf("demo summary %+v: want %d SUCCEEDED, %d DEAD and %d DLQ records", sum, wantOK, wantDead, wantDead)
	}
	for _, e := range sum.DLQ {
		if !strings.HasPrefix(e.ID, "ingest.tasks.dlq/") || !strings.HasPrefix(e.SourceID, "ingest.tasks/") {
			t.Errorf("DLQ entry %+v: want a record of the DLQ topic naming its task record", e)
		}
	}
	joined := strings.Join(sum.Commands, "\n")
	if strings.Contains(joined, "redis-cli") || !strings.Contains(joined, "INGEST_QUEUE=kafka") {
		t.Errorf("demo commands %q: want the Kafka-mode commands", sum.Commands)
	}
	var unsent int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event WHERE status <> 'SENT' OR stream_id NOT LIKE 'ingest.tasks/%'`).Scan(&unsent); err != nil || unsent != 0 {
		t.Errorf("%d outbox rows not SENT to the topic (%v)", unsent, err)
	}
}

// sslOn reports whether the server of db has SSL on.
func sslOn(t *testing.T, db *pgxpool.Pool) bool {
	t.Helper()
	var ssl string
	if err := db.QueryRow(context.Background(), `SHOW ssl`).Scan(&ssl); err != nil {
		t.Fatal(err)
	}
	return ssl == "on"
}
