package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestTaskShowGraphAndRedriveWithDependents: task show prints a task's
// ancestors and descendants with their states; task redrive
// --with-dependents revives the dependents the task's death cancelled.
func TestTaskShowGraphAndRedriveWithDependents(t *testing.T) {
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
	res, err := store.CreateBatch(ctx, []task.NewTask{
		{Kind: "fetch", Payload: json.RawMessage(`1`), Ref: "fetch", MaxAttempts: 1},
		{Kind: "parse", Payload: json.RawMessage(`2`), Ref: "parse", DependsOnRefs: []string{"fetch"}},
		{Kind: "index", Payload: json.RawMessage(`3`), DependsOnRefs: []string{"parse"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	fetch, parse, index := res[0].Task.ID, res[1].Task.ID, res[2].Task.ID
	r := runBin(t, bin, env, "", "enqueue", "--kind", "notify", "--payload", "{}", "--depends-on", index.String(), "--on-dependency-failure", "run")
	notify, err := uuid.Parse(strings.TrimSpace(r.stdout))
	if r.code != 0 || err != nil {
		t.Fatalf("enqueue --depends-on: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if got, err := store.Get(ctx, notify); err != nil || got.WaitingFor != 1 || got.OnDependencyFailure != task.OnFailureRun {
		t.Fatalf("enqueued dependent: waiting %d, policy %q (%v)", got.WaitingFor, got.OnDependencyFailure, err)
	}
	for _, args := range [][]string{{"--depends-on", "nope"}, {"--depends-on", uuid.NewString()}, {"--on-dependency-failure", "skip"}} {
		if r := runBin(t, bin, env, "", append([]string{"enqueue", "--kind", "k", "--payload", "{}"}, args...)...); r.code != exitUsage {
			t.Errorf("enqueue %v: exit %d, want %d: %s", args, r.code, exitUsage, r.stderr)
		}
	}
	r = runBin(t, bin, env, "", "task", "show", parse.String())
	for _, want := range []string{"DEPENDENCIES", "held: waiting for 1", "depends on:", "- " + fetch.String() + " fetch QUEUED",
		"dependents:", "- " + index.String() + " index QUEUED (waiting for 1)", "workflow " + fetch.String()} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("task show: exit %d, stdout lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}
	if rs, err := store.Start(ctx, "w", time.Minute, fetch); err != nil || rs[0].Outcome != task.Started {
		t.Fatalf("Start = %+v, %v", rs, err)
	}
	if _, err := store.Fail(ctx, "w", task.Failure{ID: fetch, Error: "boom", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if r := runBin(t, bin, env, "", "task", "redrive", "--with-dependents", "--status", "DEAD"); r.code != exitUsage {
		t.Errorf("--with-dependents with a filter: exit %d, want %d", r.code, exitUsage)
	}
	r = runBin(t, bin, env, "", "task", "redrive", "--with-dependents", fetch.String())
	if r.code != 0 || !strings.Contains(r.stdout, "revived") {
		t.Fatalf("redrive --with-dependents: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, id := range []uuid.UUID{parse, index} {
		got, err := store.Get(ctx, id)
		if err != nil || got.Status != task.Queued || got.WaitingFor != 1 {
			t.Fatalf("revived %s: %s waiting %d (%v)", id, got.Status, got.WaitingFor, err)
		}
		if !strings.Contains(r.stdout, id.String()) {
			t.Errorf("redrive output does not list the revived %s:\n%s", id, r.stdout)
		}
	}

	// It dies again, cancelling them again; a replay of its DLQ entry
	// with --with-dependents revives them.
	if rs, err := store.Start(ctx, "w", time.Minute, fetch); err != nil || rs[0].Outcome != task.Started {
		t.Fatalf("Start = %+v, %v", rs, err)
	}
	if _, err := store.Fail(ctx, "w", task.Failure{ID: fetch, Error: "boom", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if got, _ := store.Get(ctx, index); got.Status != task.Cancelled {
		t.Fatalf("dependent after the second death: %s", got.Status)
	}
	rdb := testenv.Client(t, testenv.RedisURL(t))
	entry, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: dlqKey, Values: []string{dlq.FieldTaskID, fetch.String(), dlq.FieldKind, "fetch"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	r = runBin(t, bin, env, "", "dlq", "replay", "--with-dependents", entry)
	if r.code != 0 || !strings.Contains(r.stderr, "revived 2 dependents") {
		t.Fatalf("dlq replay --with-dependents: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if got, _ := store.Get(ctx, index); got.Status != task.Queued {
		t.Fatalf("dependent after the replay: %s", got.Status)
	}
}
