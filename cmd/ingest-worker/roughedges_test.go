package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestDLQReplayOfATaskID: a task id given to dlq replay is refused as a
// usage error that says it is a task id and names the commands that take
// one, not Redis's "ERR Invalid stream ID"; any other non-entry argument
// says what an entry id looks like; likewise a DLQ entry id given to a
// task command. None needs a server.
func TestDLQReplayOfATaskID(t *testing.T) {
	t.Parallel()
	env := map[string]string{"INGEST_REDIS_URL": "redis://127.0.0.1:1/0", "INGEST_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	for args, want := range map[[3]string][]string{
		{"dlq", "replay", "0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f"}: {"ENTRY_ID", "is a task id", "task redrive ID", "dlq discard --task"},
		{"dlq", "replay", "oops"}:                                 {"ENTRY_ID", `"oops"`, "not a DLQ entry id", "1718000000000-0"},
		// The siblings: a task command given a DLQ entry id or garbage.
		{"task", "show", "1718000000000-0"}:   {"ID", "is a DLQ entry id", "dlq replay ENTRY_ID"},
		{"task", "cancel", "1718000000000-0"}: {"ID", "is a DLQ entry id", "dlq replay ENTRY_ID"},
		{"task", "show", "oops"}:              {"ID", `"oops"`, "not a task id", "UUID"},
	} {
		arg := args[2]
		code, stdout, stderr := runCLI(t, env, args[:]...)
		if code != exitUsage {
			t.Errorf("dlq replay %s: exit %d, want %d\nstdout: %s\nstderr: %s", arg, code, exitUsage, stdout, stderr)
		}
		for _, w := range want {
			if !strings.Contains(stderr, w) {
				t.Errorf("dlq replay %s: stderr %q lacks %q", arg, stderr, w)
			}
		}
		if strings.Contains(stderr, "ERR") {
			t.Errorf("dlq replay %s: stderr %q holds Redis's text", arg, stderr)
		}
	}
}

// TestKindChangeOfAnUnknownKind: kind pause, resume and set of a kind that
// has neither tasks nor settings warn on stderr, naming the kind and
// --force, and set it; --force sets one without the warning; a kind with
// tasks draws no warning.
func TestKindChangeOfAnUnknownKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(ctx, task.NewTask{Kind: "known.kind", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"INGEST_DATABASE_URL": db.URL, "INGEST_REDIS_URL": "redis://127.0.0.1:1/0"}
	for _, args := range [][]string{
		{"kind", "pause", "typo.kind"},
		{"kind", "resume", "typo.kind"},
		{"kind", "set", "typo.kind", "--concurrency", "2"},
	} {
		kind := "typo." + args[1]
		args[2] = kind
		code, stdout, stderr := runCLI(t, env, args...)
		if code != 0 || !strings.Contains(stderr, "warning: kind \""+kind+"\" has no tasks and no settings") || !strings.Contains(stderr, "--force") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want success with a warning naming the kind and --force", args, code, stdout, stderr)
		}
		if _, known, err := store.Kind(ctx, kind); err != nil || !known {
			t.Errorf("after %q the kind is not known: %v, %v", args, known, err)
		}
	}
	if code, stdout, stderr := runCLI(t, env, "kind", "pause", "known.kind"); code != 0 || !strings.Contains(stdout, "paused") || stderr != "" {
		t.Fatalf("kind pause of a kind with tasks: exit %d, stdout %q, stderr %q; want no warning", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(t, env, "kind", "pause", "future.kind", "--force"); code != 0 || !strings.Contains(stdout, "paused") || strings.Contains(stderr, "warning") {
		t.Fatalf("kind pause --force: exit %d, stdout %q, stderr %q; want no warning", code, stdout, stderr)
	}
	if k, known, err := store.Kind(ctx, "future.kind"); err != nil || !known || !k.Paused {
		t.Fatalf("after kind pause --force: %+v, %v, %v; want it paused", k, known, err)
	}
}

// TestNextRunAndColumnHelp: task show labels the due time of a delayed task
// that never ran "next run" (not "next retry"), and task list --help
// explains its FAILED/MAX column and the w in it.
func TestNextRunAndColumnHelp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	r, err := store.Create(ctx, task.NewTask{Kind: "later", Payload: json.RawMessage(`{}`), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"INGEST_DATABASE_URL": db.URL, "INGEST_REDIS_URL": "redis://127.0.0.1:1/0"}
	code, stdout, stderr := runCLI(t, env, "task", "show", r.Task.ID.String())
	if !strings.Contains(stdout, "next run") || strings.Contains(stdout, "next retry") {
		t.Fatalf("task show of a delayed task (exit %d): stdout %q, stderr %q; want \"next run\"", code, stdout, stderr)
	}
	_, stdout, _ = runCLI(t, env, "task", "list", "--help")
	for _, w := range []string{"FAILED/MAX", "w: the workers' setting", "INGEST_REDIS_MAX_ATTEMPTS"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("task list --help lacks %q:\n%s", w, stdout)
		}
	}
	_, stdout, _ = runCLI(t, env, "kind", "list", "--help")
	for _, w := range []string{"STATE", "active", "PARKED", "STARTS/S"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("kind list --help lacks %q:\n%s", w, stdout)
		}
	}
}

// TestABadSettingStopsOnlyItsCommands: a malformed INGEST_PERIODIC (a
// worker setting) stops the commands that use it (periodic; config shows
// the table and exits 2) and no other: task list, task show and dlq list
// warn that they ignore it and work. A bad worker setting that task
// commands do use (INGEST_REDIS_MAX_ATTEMPTS, shown in FAILED/MAX) still
// stops them, and a bad global one stops everything.
func TestABadSettingStopsOnlyItsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	store, err := task.NewStore(task.Config{Stream: stream}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	r, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	env := func(extra ...string) map[string]string {
		m := map[string]string{"INGEST_DATABASE_URL": db.URL, "INGEST_REDIS_URL": testenv.RedisURL(t),
			"INGEST_REDIS_STREAM_KEY": stream, "INGEST_REDIS_DLQ_STREAM_KEY": dlqKey, "INGEST_PERIODIC": "{not json"}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	for _, args := range [][]string{{"task", "list"}, {"task", "show", r.Task.ID.String()}, {"dlq", "list"}} {
		code, stdout, stderr := runCLI(t, env(), args...)
		if code != 0 || !strings.Contains(stderr, "warning: ignoring INGEST_PERIODIC") {
			t.Errorf("%q with a bad INGEST_PERIODIC: exit %d, stdout %q, stderr %q; want it to work and warn", args, code, stdout, stderr)
		}
	}
	if code, _, stderr := runCLI(t, env(), "periodic"); code != exitUsage || !strings.Contains(stderr, "INGEST_PERIODIC") {
		t.Errorf("periodic with a bad INGEST_PERIODIC: exit %d, stderr %q; want a usage error naming it", code, stderr)
	}
	if code, stdout, stderr := runCLI(t, env(), "config"); code != exitUsage || !strings.Contains(stderr, "INGEST_PERIODIC") || !strings.Contains(stdout, "INGEST_LOG_LEVEL") {
		t.Errorf("config with a bad INGEST_PERIODIC: exit %d, stdout %q, stderr %q; want the table and a usage error naming it", code, stdout, stderr)
	}
	if code, _, stderr := runCLI(t, env("INGEST_REDIS_MAX_ATTEMPTS", "0"), "task", "list"); code != exitUsage || !strings.Contains(stderr, "INGEST_REDIS_MAX_ATTEMPTS") {
		t.Errorf("task list with INGEST_REDIS_MAX_ATTEMPTS=0: exit %d, stderr %q; want a usage error naming it", code, stderr)
	}
	if code, _, stderr := runCLI(t, env("INGEST_LOG_LEVEL", "loud"), "task", "list"); code != exitUsage || !strings.Contains(stderr, "INGEST_LOG_LEVEL") {
		t.Errorf("task list with INGEST_LOG_LEVEL=loud: exit %d, stderr %q; want a usage error naming it", code, stderr)
	}
}
