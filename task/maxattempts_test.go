package task_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestMaxAttemptsFollowsTheFailingStore: a task created without
// max_attempts (by a process whose MaxAttempts is 10, say the CLI) is
// governed by the MaxAttempts of the store that records its failures (the
// workers' INGEST_REDIS_MAX_ATTEMPTS), in the failing statement and in a
// takeover; a task's own max_attempts wins.
func TestMaxAttemptsFollowsTheFailingStore(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{MaxAttempts: 10}) // the creating process
	worker, err := task.NewStore(fastRetry(2), b.db)
	if err != nil {
		t.Fatal(err)
	}
	payload := json.RawMessage(`{}`)
	loose := b.create(t, task.NewTask{Kind: "k", Payload: payload})
	own := b.create(t, task.NewTask{Kind: "k", Payload: payload, MaxAttempts: 3})
	if loose.MaxAttempts != nil || own.MaxAttempts == nil || *own.MaxAttempts != 3 {
		t.Fatalf("created max_attempts %v and %v, want none and 3", loose.MaxAttempts, own.MaxAttempts)
	}
	var n int
	if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM ingest_task WHERE id = $1 AND max_attempts IS NULL`, loose.ID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("max_attempts of a task created without one is not NULL in SQL (%d, %v)", n, err)
	}

	fail := func(tk task.Task) task.Result {
		t.Helper()
		testenv.Eventually(t, 5*time.Second, "the task due", func() bool {
			rs, err := worker.Start(b.ctx, "w", time.Minute, tk.ID)
			if err != nil {
				t.Fatal(err)
			}
			return rs[0].Outcome == task.Started
		})
		rs, err := worker.Fail(b.ctx, "w", task.Failure{ID: tk.ID, Error: "boom"})
		if err != nil || len(rs) != 1 || !rs[0].Applied {
			t.Fatalf("Fail = %+v, %v", rs, err)
		}
		return rs[0]
	}
	if r := fail(loose); r.Status != task.Retrying || r.AttemptCount != 1 {
		t.Fatalf("first failure: %s with %d attempts, want RETRYING with 1", r.Status, r.AttemptCount)
	}
	if r := fail(loose); r.Status != task.Dead || r.AttemptCount != 2 {
		t.Fatalf("second failure under the worker's 2 attempts: %s with %d, want DEAD with 2", r.Status, r.AttemptCount)
	}
	fail(own)
	if r := fail(own); r.Status != task.Retrying || r.AttemptCount != 2 {
		t.Fatalf("the task's own max_attempts 3: second failure %s with %d attempts, want RETRYING with 2", r.Status, r.AttemptCount)
	}

	// A takeover counts the abandoned run against the worker's limit too.
	taken := b.create(t, task.NewTask{Kind: "k", Payload: payload})
	fail(taken)
	testenv.Eventually(t, 5*time.Second, "the retry due", func() bool {
		rs, err := worker.Start(b.ctx, "crashed", 50*time.Millisecond, taken.ID)
		if err != nil {
			t.Fatal(err)
		}
		return rs[0].Outcome == task.Started
	})
	testenv.Eventually(t, 5*time.Second, "the takeover", func() bool {
		rs, err := worker.Start(b.ctx, "w2", time.Minute, taken.ID)
		if err != nil {
			t.Fatal(err)
		}
		return rs[0].Outcome == task.DiedOnTakeover
	})
	got, err := worker.Get(b.ctx, taken.ID)
	if err != nil || got.Status != task.Dead || got.AttemptCount != 2 {
		t.Fatalf("after the takeover of its last attempt: %+v, %v; want DEAD with 2 attempts", got, err)
	}
}
