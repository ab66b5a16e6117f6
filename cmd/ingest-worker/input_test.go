package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// runCLI runs the command line in this process and returns its exit code,
// stdout and stderr.
func runCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := execute(context.Background(), args, strings.NewReader(""), &stdout, &stderr, envOf(env))
	return code, stdout.String(), stderr.String()
}

// screenSafe reports whether text holds no character a terminal would act
// on but its new lines.
func screenSafe(text string) bool { return termsafe.Safe(strings.ReplaceAll(text, "\n", "")) }

// TestHostileDataPrintsSafely: rows written before names were checked (or
// by SQL), whose kind, idempotency key, errors, lease owner, consumer and
// DLQ fields hold terminal escapes, bidirectional overrides and new lines,
// are printed by every command as visible escapes: nothing reaches the
// terminal that clears the screen, retitles it or reorders text. --json
// output holds the same strings, escaped so as well.
func TestHostileDataPrintsSafely(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	rdb := testenv.Redis(t)
	const (
		kind  = "esc\x1b[2J\x1b]0;pwned\a"
		bidi  = "abc\u202edef"
		key   = "key\nFAKE LINE\u0085"
		owner = "w\x1b[31m\u2067"
		msg   = "boom\x1b[1A\r\u202egnp.exe"
	)
	store, err := task.NewStore(task.Config{Stream: stream}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	r, err := store.Create(ctx, task.NewTask{Kind: "placeholder", Payload: json.RawMessage(`{"note":"x\u202ey\u009b"}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Task.ID
	if _, err := store.Start(ctx, owner, time.Minute, id); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fail(ctx, owner, task.Failure{ID: id, Error: msg, Permanent: true}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE ingest_task SET kind = '` + kind + `', idempotency_key = '` + key + `' WHERE id = '` + id.String() + `'`,
		`INSERT INTO ingest_kind (kind, paused, updated_by) VALUES ('` + bidi + `', true, '` + owner + `')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// A DLQ entry and a pending entry of a consumer with such names.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: dlqKey, Values: []any{"task_id", id.String(), "kind", kind, "last_error", msg, "attempt_count", "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"task_id", id.String(), "kind", kind}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupCreate(ctx, stream, "ingest-workers", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "ingest-workers", Consumer: owner, Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"INGEST_DATABASE_URL": db.URL, "INGEST_REDIS_URL": testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY": stream, "INGEST_REDIS_DLQ_STREAM_KEY": dlqKey}

	for _, args := range [][]string{
		{"kind", "list"},
		{"task", "list"},
		{"task", "list", "--kind", kind},
		{"task", "show", id.String()},
		{"dlq", "list"},
		{"pending"},
		{"task", "redrive", "--status", "DEAD", "--kind", kind, "--dry-run"},
		{"kind", "pause", kind}, // refused: the message quotes the kind
	} {
		code, stdout, stderr := runCLI(t, env, args...)
		if !screenSafe(stdout) || !screenSafe(stderr) {
			t.Errorf("%q (exit %d) printed characters a terminal acts on:\nstdout: %q\nstderr: %q", args, code, stdout, stderr)
		}
		if args[0] == "kind" && args[1] == "pause" {
			if code != exitUsage || !strings.Contains(stderr, `\x1b`) {
				t.Errorf("kind pause of a hostile kind: exit %d, stderr %q; want 2 and the kind escaped", code, stderr)
			}
			continue
		}
		if code != exitOK {
			t.Errorf("%q: exit %d\nstderr: %s", args, code, stderr)
		}
	}
	_, out, _ := runCLI(t, env, "task", "show", id.String())
	// (An error is shown on one line: its \r as a space.)
	for _, want := range []string{`esc\x1b[2J\x1b]0;pwned\a`, `key\nFAKE LINE\u0085`, `boom\x1b[1A \u202egnp.exe`, `w\x1b[31m\u2067`} {
		if !strings.Contains(out, want) {
			t.Errorf("task show does not show %s:\n%s", want, out)
		}
	}
	if _, out, _ := runCLI(t, env, "kind", "list"); !strings.Contains(out, `abc\u202edef`) {
		t.Errorf("kind list does not show the kind escaped:\n%s", out)
	}

	// --json: the same strings, with the characters escaped as JSON.
	for _, args := range [][]string{{"task", "list", "--json"}, {"task", "show", id.String(), "--json"}, {"kind", "list", "--json"}, {"dlq", "list", "--json"}} {
		code, stdout, stderr := runCLI(t, env, args...)
		if code != exitOK || !screenSafe(stdout) || !json.Valid([]byte(stdout)) {
			t.Errorf("%q: exit %d, safe %v, valid JSON %v:\n%q\n%s", args, code, screenSafe(stdout), json.Valid([]byte(stdout)), stdout, stderr)
		}
	}
	_, out, _ = runCLI(t, env, "task", "list", "--json")
	var list struct{ Tasks []task.Task }
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Tasks) != 1 || list.Tasks[0].Kind != kind || list.Tasks[0].LastError != msg {
		t.Fatalf("task list --json decodes to %+v (%v), want the kind %q and error %q as stored", list.Tasks, err, kind, msg)
	}
}

// TestFlagsAreRangeChecked: a numeric flag out of its range (or no whole
// number) is a usage error (exit 2) naming the flag and the range, found
// before anything is done; enqueue --max-attempts 3000000000 printed a raw
// SQL error. A name with a control character is refused naming its flag.
func TestFlagsAreRangeChecked(t *testing.T) {
	t.Parallel()
	env := map[string]string{"INGEST_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--max-attempts", "3000000000"}, []string{"--max-attempts", "from 1 to 1000000"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--max-attempts", "0"}, []string{"--max-attempts", "from 1 to 1000000"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--max-attempts", "99999999999999999999"}, []string{"--max-attempts", "from 1 to 1000000"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--delay", "1000000h"}, []string{"--delay", "delay_ms", "from 0 to"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--timeout", "600h"}, []string{"--timeout", "timeout_ms", "from 0 to 2147483647"}},
		{[]string{"enqueue", "--kind", "esc\x1b[2J", "--payload", "{}"}, []string{"--kind", `\x1b`}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--idempotency-key", "a\u202eb"}, []string{"--idempotency-key", `\u202e`}},
		{[]string{"task", "list", "--limit", "1001"}, []string{"--limit", "from 1 to 1000"}},
		{[]string{"task", "list", "--limit", "1e3"}, []string{"--limit", "from 1 to 1000"}},
		{[]string{"task", "list", "--workflow", "doc-1"}, []string{"--workflow", "not a workflow id"}},
		{[]string{"task", "redrive", "--status", "DEAD", "--limit", "1000001"}, []string{"--limit", "from 1 to 1000000"}},
		{[]string{"task", "redrive", "--status", "DEAD", "--rate", "NaN"}, []string{"--rate", "0.01"}},
		{[]string{"task", "redrive", "--status", "DEAD", "--rate", "1e-300"}, []string{"--rate", "0.01"}},
		{[]string{"kind", "set", "k", "--concurrency", "4294967297"}, []string{"--concurrency", "from 0 to 100000"}},
		{[]string{"dlq", "list", "--limit", "0"}, []string{"--limit", "from 1 to"}},
		{[]string{"dlq", "list", "--after", "garbage"}, []string{"--after", "not a DLQ entry id"}},
		{[]string{"pending", "--oldest", "-1"}, []string{"--oldest", "from 0 to 1000"}},
		{[]string{"healthcheck", "--timeout", "-1s"}, []string{"--timeout", "> 0"}},
		{[]string{"run", "--worker-concurrency", "1000000000000"}, []string{"INGEST_WORKER_CONCURRENCY", "--worker-concurrency", "from 1 to 100000"}},
	} {
		code, stdout, stderr := runCLI(t, env, tc.args...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d\nstdout: %s\nstderr: %s", tc.args, code, exitUsage, stdout, stderr)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: stderr %q does not name %q", tc.args, stderr, w)
			}
		}
		if !screenSafe(stderr) {
			t.Errorf("%q: stderr %q holds characters a terminal acts on", tc.args, stderr)
		}
	}
}
