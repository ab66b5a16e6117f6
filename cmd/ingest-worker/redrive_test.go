package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
)

// TestEveryRedrivePathRemovesTheDLQEntry: whichever way a DEAD task is
// redriven (the API for one task or by filter, the CLI's task redrive and
// dlq replay, the dashboard's task page, DLQ entry and bulk form), its DLQ
// entry goes in the same step; when it dies again it has one entry, so the
// DLQ's depth stays the number of DEAD tasks with an entry.
func TestEveryRedrivePathRemovesTheDLQEntry(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	redisURL := testenv.RedisURL(t)
	rdb := testenv.Client(t, redisURL)
	// Every attempt is refused for good (a 4xx): DEAD at once, with a DLQ entry.
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusUnprocessableEntity) }))
	t.Cleanup(hook.Close)
	env := []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + redisURL,
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey, "INGEST_CONSUMER_NAME=redrive-test"}
	addr := freeAddr(t)
	base := "http://" + addr
	worker := start(t, bin, env, "run", "--http-addr", addr, "--webhook-url", hook.URL)
	waitReady(t, worker, addr)
	ctx := context.Background()

	entriesOf := func(id uuid.UUID) []dlq.Entry {
		t.Helper()
		all, err := dlq.List(ctx, rdb, dlqKey, dlq.ListParams{Count: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var out []dlq.Entry
		for _, e := range all {
			if e.TaskID == id.String() {
				out = append(out, e)
			}
		}
		return out
	}
	deaths := func(id uuid.UUID) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task_transition WHERE task_id = $1 AND to_status = 'DEAD'`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// awaitDeath waits until task id has died n times and has its DLQ entry.
	awaitDeath := func(id uuid.UUID, n int) {
		t.Helper()
		testenv.Eventually(t, time.Minute, fmt.Sprintf("task %s to die %d times with a DLQ entry", id, n), func() bool {
			worker.mustBeRunning()
			return deaths(id) == n && len(entriesOf(id)) > 0
		})
	}
	// depthMatches asserts one entry per DEAD task, and no other entry.
	depthMatches := func(path string) {
		t.Helper()
		var dead int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE status = 'DEAD'`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		depth, err := rdb.XLen(ctx, dlqKey).Result()
		if err != nil {
			t.Fatal(err)
		}
		if depth != int64(dead) {
			t.Fatalf("after %s: DLQ depth %d, DEAD tasks %d", path, depth, dead)
		}
	}
	post := func(path, contentType, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+path, contentType, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// The dashboard, as a browser: cookies, its CSRF token, no redirects.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	csrfRE := regexp.MustCompile(`name="csrf" (?:value|content)="([^"]+)"`)
	uiPost := func(path string, form url.Values) {
		t.Helper()
		resp, err := browser.Get(base + "/ui/dlq")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := csrfRE.FindStringSubmatch(string(page))
		if m == nil {
			t.Fatalf("no CSRF token on the DLQ page:\n%s", page)
		}
		form.Set("csrf", m[1])
		resp, err = browser.PostForm(base+path, form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("POST %s: %d, want 303", path, resp.StatusCode)
		}
	}

	paths := []struct {
		name    string
		redrive func(id uuid.UUID, kind string)
	}{
		{"API", func(id uuid.UUID, _ string) {
			if code, body := post("/v1/tasks/"+id.String()+"/redrive", "application/json", ""); code != http.StatusOK {
				t.Fatalf("POST /v1/tasks/{id}/redrive: %d %s", code, body)
			}
		}},
		{"APIBulk", func(_ uuid.UUID, kind string) {
			if code, body := post("/v1/tasks/redrive", "application/json", `{"status":"DEAD","kind":"`+kind+`"}`); code != http.StatusOK {
				t.Fatalf("POST /v1/tasks/redrive: %d %s", code, body)
			}
		}},
		{"CLITaskRedrive", func(_ uuid.UUID, kind string) {
			mustRun(t, bin, env, "", "task", "redrive", "--status", "DEAD", "--kind", kind)
		}},
		{"CLIDLQReplay", func(id uuid.UUID, _ string) {
			mustRun(t, bin, env, "", "dlq", "replay", entriesOf(id)[0].ID)
		}},
		{"DashboardTask", func(id uuid.UUID, _ string) {
			uiPost("/ui/tasks/"+id.String()+"/redrive", url.Values{})
		}},
		{"DashboardDLQEntry", func(id uuid.UUID, _ string) {
			uiPost("/ui/dlq/replay", url.Values{"entry": {entriesOf(id)[0].ID}})
		}},
		{"DashboardBulk", func(_ uuid.UUID, kind string) {
			uiPost("/ui/dlq/redrive", url.Values{"status": {"DEAD"}, "kind": {kind}})
		}},
	}
	ids := make([]uuid.UUID, len(paths))
	for i, p := range paths {
		code, body := post("/v1/tasks", "application/json", `{"kind":"redrive.`+strings.ToLower(p.name)+`","payload":{}}`)
		var created struct {
			ID uuid.UUID `json:"id"`
		}
		if err := json.Unmarshal([]byte(body), &created); err != nil || code != http.StatusCreated {
			t.Fatalf("create: %d %s", code, body)
		}
		ids[i] = created.ID
	}
	for _, id := range ids {
		awaitDeath(id, 1)
	}
	depthMatches("the first deaths")
	for i, p := range paths {
		id, kind := ids[i], "redrive."+strings.ToLower(p.name)
		old := entriesOf(id)
		p.redrive(id, kind)
		// The task may already have died again: its old entry is gone.
		for _, e := range entriesOf(id) {
			if e.ID == old[0].ID {
				t.Fatalf("%s: the redriven task keeps its DLQ entry %s", p.name, e.ID)
			}
		}
		awaitDeath(id, 2)
		if n := len(entriesOf(id)); n != 1 {
			t.Fatalf("%s: the task died again and has %d DLQ entries, want 1", p.name, n)
		}
		depthMatches(p.name)
	}
}
