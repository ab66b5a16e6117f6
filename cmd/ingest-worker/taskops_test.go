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

// TestTaskDeleteRunNowRedriveDiscard: task delete removes terminal tasks
// with their DLQ entries and keeps live ones (exit 1), task run-now makes a
// delayed task due now, task redrive ID... redrives exactly those tasks and
// removes their DLQ entries, dlq discard removes entries and leaves the
// task DEAD; bad arguments exit 2 naming the argument.
func TestTaskDeleteRunNowRedriveDiscard(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	redisURL := testenv.RedisURL(t)
	rdb := testenv.Client(t, redisURL)
	env := []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + redisURL,
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey, "INGEST_CONSUMER_NAME=ops-test"}
	ctx := context.Background()
	store, err := task.NewStore(task.Config{Stream: stream}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	create := func(runAt time.Time) uuid.UUID {
		t.Helper()
		r, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), RunAt: runAt})
		if err != nil {
			t.Fatal(err)
		}
		return r.Task.ID
	}
	// kill makes a DEAD task with a DLQ entry; it returns the entry id.
	kill := func() (uuid.UUID, string) {
		t.Helper()
		id := create(time.Time{})
		if _, err := store.Start(ctx, "w", time.Minute, id); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Fail(ctx, "w", task.Failure{ID: id, Error: "boom", Permanent: true}); err != nil {
			t.Fatal(err)
		}
		e, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: dlqKey, Values: []any{dlq.FieldTaskID, id.String(), dlq.FieldKind, "k"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		return id, e
	}
	exists := func(id uuid.UUID) bool {
		t.Helper()
		_, err := store.Get(ctx, id)
		return err == nil
	}
	entries := func(id uuid.UUID) int {
		t.Helper()
		n, _, err := dlq.FindTask(ctx, rdb, dlqKey, id.String(), 1000)
		if err != nil {
			t.Fatal(err)
		}
		return len(n)
	}

	t.Run("BadArguments", func(t *testing.T) {
		for _, args := range [][]string{
			{"task", "delete", uuid.NewString(), "nope"},
			{"task", "run-now", "nope"},
			{"task", "redrive", "nope"},
			{"task", "redrive", uuid.NewString(), "--status", "DEAD"},
			{"dlq", "discard", "nope"},
			{"dlq", "discard", "--task", "nope"},
			{"dlq", "discard"},
		} {
			r := runBin(t, bin, env, "", args...)
			if r.code != exitUsage {
				t.Errorf("%v: exit %d, want 2\n%s", args, r.code, r.stderr)
			}
			if strings.Contains(strings.Join(args, " "), "nope") && !strings.Contains(r.stderr, `"nope"`) {
				t.Errorf("%v: error %q does not name the argument", args, r.stderr)
			}
		}
	})

	t.Run("Delete", func(t *testing.T) {
		dead, _ := kill()
		live := create(time.Time{})
		r := runBin(t, bin, env, "", "task", "delete", dead.String(), live.String())
		if r.code != 1 || !strings.Contains(r.stdout, "deleted") || !strings.Contains(r.stdout, "kept (live)") {
			t.Fatalf("task delete DEAD and QUEUED: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		if exists(dead) || !exists(live) {
			t.Fatalf("after task delete: DEAD task exists %v (want false), QUEUED exists %v (want true)", exists(dead), exists(live))
		}
		if n := entries(dead); n != 0 {
			t.Fatalf("deleted task keeps %d DLQ entries", n)
		}
		if !strings.Contains(r.stderr, "task deleted") || !strings.Contains(r.stderr, "cli:") {
			t.Errorf("no log line with the actor for the deletion:\n%s", r.stderr)
		}
	})

	t.Run("RunNow", func(t *testing.T) {
		id := create(time.Now().Add(time.Hour))
		out := mustRun(t, bin, env, "", "task", "run-now", id.String())
		if !strings.Contains(out, "due now") {
			t.Fatalf("task run-now: %q", out)
		}
		tk, err := store.Get(ctx, id)
		if err != nil || tk.NextRetryAt == nil || tk.NextRetryAt.After(time.Now()) {
			t.Fatalf("after run-now: %+v %v; want due now", tk.NextRetryAt, err)
		}
		r := runBin(t, bin, env, "", "task", "run-now", id.String())
		if r.code != 1 || !strings.Contains(r.stderr, "already due") {
			t.Fatalf("task run-now of a due task: exit %d %s", r.code, r.stderr)
		}
	})

	t.Run("RedriveIDs", func(t *testing.T) {
		dead, _ := kill()
		other, _ := kill()
		out := mustRun(t, bin, env, "", "--json", "task", "redrive", dead.String())
		var got struct {
			Results []struct {
				ID      uuid.UUID `json:"id"`
				Outcome string    `json:"outcome"`
			} `json:"results"`
			DLQRemoved int `json:"dlq_removed"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Results) != 1 || got.Results[0].Outcome != "redriven" || got.DLQRemoved != 1 {
			t.Fatalf("task redrive ID --json: %q %v", out, err)
		}
		if tk, _ := store.Get(ctx, dead); tk.Status != task.Queued {
			t.Fatalf("redriven task is %s, want QUEUED", tk.Status)
		}
		if tk, _ := store.Get(ctx, other); tk.Status != task.Dead || entries(other) != 1 {
			t.Fatalf("the other DEAD task: %s with %d entries, want DEAD with 1", tk.Status, entries(other))
		}
	})

	t.Run("Discard", func(t *testing.T) {
		byEntry, entry := kill()
		byTask, _ := kill()
		out := mustRun(t, bin, env, "", "dlq", "discard", entry)
		if !strings.Contains(out, "discarded") {
			t.Fatalf("dlq discard ENTRY: %q", out)
		}
		mustRun(t, bin, env, "", "dlq", "discard", "--task", byTask.String())
		for _, id := range []uuid.UUID{byEntry, byTask} {
			if tk, _ := store.Get(ctx, id); tk.Status != task.Dead || entries(id) != 0 {
				t.Fatalf("after dlq discard: %s with %d entries, want DEAD with none", tk.Status, entries(id))
			}
		}
		if r := runBin(t, bin, env, "", "dlq", "discard", entry); r.code != 1 {
			t.Fatalf("dlq discard of a gone entry: exit %d, want 1", r.code)
		}
	})
}
