package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// rows counts the task, transition and outbox rows of the database.
func (b *bundle) rows(t *testing.T) [3]int {
	t.Helper()
	return [3]int{
		b.count(t, `SELECT count(*) FROM ingest_task`),
		b.count(t, `SELECT count(*) FROM ingest_task_transition`),
		b.count(t, `SELECT count(*) FROM outbox_event`),
	}
}

func TestCreateTx(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{false, true} {
		name := "Rollback"
		if commit {
			name = "Commit"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, task.Config{Stream: "ingest:custom"})
			tx, err := b.db.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(b.ctx) //nolint:errcheck
			// The caller's own business write, in the same transaction.
			if _, err := tx.Exec(b.ctx, `CREATE TABLE business (x int); INSERT INTO business VALUES (1)`); err != nil {
				t.Fatal(err)
			}
			res, err := b.store.CreateTx(b.ctx, tx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"order":7}`)})
			if err != nil || len(res) != 1 || res[0].Existing {
				t.Fatalf("CreateTx = %+v, %v", res, err)
			}
			id := res[0].Task.ID
			var inTx int
			if err := tx.QueryRow(b.ctx, `SELECT count(*) FROM ingest_task WHERE id = $1`, id).Scan(&inTx); err != nil || inTx != 1 {
				t.Fatalf("the task is not visible inside its transaction: %d, %v", inTx, err)
			}
			if got := b.rows(t); got != [3]int{0, 0, 0} {
				t.Fatalf("before the caller commits, other sessions see %v task/transition/outbox rows, want none", got)
			}
			if commit {
				err = tx.Commit(b.ctx)
			} else {
				err = tx.Rollback(b.ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			want := [3]int{0, 0, 0}
			if commit {
				want = [3]int{1, 1, 1}
			}
			if got := b.rows(t); got != want {
				t.Fatalf("after %s: %v task/transition/outbox rows, want %v", name, got, want)
			}
			if !commit {
				return
			}
			if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND stream = 'ingest:custom' AND status = 'NEW'`, id); n != 1 {
				t.Fatalf("no NEW outbox event for the task on the configured stream")
			}
			if tk := b.get(t, id); tk.Status != task.Queued || tk.Kind != "k" || string(tk.Payload) != `{"order": 7}` {
				t.Fatalf("committed task = %+v", tk)
			}
		})
	}
}

func TestCreateBatchAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	_, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "k", Payload: json.RawMessage(`1`)},
		{Kind: "k", Payload: json.RawMessage(`{`)},
	})
	if !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), "task 1") {
		t.Fatalf("CreateBatch with a bad second task = %v, want ErrInvalidTask naming task 1", err)
	}
	if got := b.rows(t); got != [3]int{0, 0, 0} {
		t.Fatalf("a failed batch left %v rows", got)
	}
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "a", Payload: json.RawMessage(`1`)},
		{Kind: "b", Payload: json.RawMessage(`2`), MaxAttempts: 7},
	})
	if err != nil || len(res) != 2 || res[0].Task.Kind != "a" || res[1].Task.Kind != "b" || res[0].Task.MaxAttempts != nil || res[1].Task.MaxAttempts == nil || *res[1].Task.MaxAttempts != 7 {
		t.Fatalf("CreateBatch = %+v, %v; want both tasks in order", res, err)
	}
	if got := b.rows(t); got != [3]int{2, 2, 2} {
		t.Fatalf("batch of 2 left %v rows, want 2 of each", got)
	}
	if res, err := b.store.CreateBatch(b.ctx, nil); err != nil || len(res) != 0 {
		t.Fatalf("empty batch = %v, %v", res, err)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})

	t.Run("RepeatReturnsSameTask", func(t *testing.T) {
		t.Parallel()
		nt := task.NewTask{Kind: "repeat", Payload: json.RawMessage(`{"a":1}`), IdempotencyKey: "key-1"}
		first, err := b.store.Create(b.ctx, nt)
		if err != nil || first.Existing {
			t.Fatalf("first Create = %+v, %v", first, err)
		}
		nt.Payload = json.RawMessage(`{"a":2}`) // the key wins, whatever the payload
		second, err := b.store.Create(b.ctx, nt)
		if err != nil || !second.Existing || second.Task.ID != first.Task.ID || second.Task.IdempotencyKey != "key-1" {
			t.Fatalf("repeated Create = %+v, %v; want Existing with id %s", second, err, first.Task.ID)
		}
		if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'repeat'`); n != 1 {
			t.Fatalf("%d tasks, want 1", n)
		}
		if n := len(b.transitions(t, first.Task.ID)); n != 1 {
			t.Fatalf("%d transitions, want only the creation", n)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, first.Task.ID); n != 1 {
			t.Fatalf("%d outbox events, want 1", n)
		}
	})

	t.Run("OtherKindIsNewTask", func(t *testing.T) {
		t.Parallel()
		a := b.create(t, task.NewTask{Kind: "kind-a", IdempotencyKey: "shared"})
		c, err := b.store.Create(b.ctx, task.NewTask{Kind: "kind-b", Payload: json.RawMessage(`1`), IdempotencyKey: "shared"})
		if err != nil || c.Existing || c.Task.ID == a.ID {
			t.Fatalf("same key under another kind = %+v, %v; want a new task", c, err)
		}
	})

	t.Run("WithinOneBatch", func(t *testing.T) {
		t.Parallel()
		pre := b.create(t, task.NewTask{Kind: "batch", IdempotencyKey: "old"})
		res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
			{Kind: "batch", Payload: json.RawMessage(`1`), IdempotencyKey: "new"},
			{Kind: "batch", Payload: json.RawMessage(`2`), IdempotencyKey: "new"},
			{Kind: "batch", Payload: json.RawMessage(`3`), IdempotencyKey: "old"},
			{Kind: "batch", Payload: json.RawMessage(`4`)},
			{Kind: "batch", Payload: json.RawMessage(`4`)},
		})
		if err != nil || len(res) != 5 {
			t.Fatalf("CreateBatch = %+v, %v", res, err)
		}
		switch {
		case res[0].Existing || !res[1].Existing || res[1].Task.ID != res[0].Task.ID:
			t.Fatalf("a key repeated in one batch: %+v, %+v; want the second Existing with the first's id", res[0], res[1])
		case !res[2].Existing || res[2].Task.ID != pre.ID:
			t.Fatalf("an existing key in a batch: %+v, want the existing task %s", res[2], pre.ID)
		case res[3].Existing || res[4].Existing || res[3].Task.ID == res[4].Task.ID:
			t.Fatalf("tasks without a key: %+v, %+v; want two new tasks", res[3], res[4])
		}
		if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'batch'`); n != 4 {
			t.Fatalf("%d tasks of the batch kind, want 4 (old, new, and two without a key)", n)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event o JOIN ingest_task t ON t.id = o.task_id WHERE t.kind = 'batch'`); n != 4 {
			t.Fatalf("%d outbox events, want one per created task (4)", n)
		}
	})

	t.Run("ConcurrentCreators", func(t *testing.T) {
		t.Parallel()
		const n = 20
		res := make([]task.CreateResult, n)
		errs := make([]error, n)
		race(n, func(i int) {
			res[i], errs[i] = b.store.Create(b.ctx, task.NewTask{Kind: "concurrent-key", Payload: json.RawMessage(fmt.Sprint(i)), IdempotencyKey: "k"})
		})
		created := 0
		for i := range res {
			if errs[i] != nil {
				t.Fatalf("creator %d: %v", i, errs[i])
			}
			if res[i].Task.ID != res[0].Task.ID {
				t.Fatalf("creators got different tasks %s and %s", res[0].Task.ID, res[i].Task.ID)
			}
			if !res[i].Existing {
				created++
			}
		}
		if created != 1 {
			t.Fatalf("%d creators report a new task, want 1", created)
		}
		if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'concurrent-key'`); n != 1 {
			t.Fatalf("%d tasks, want 1", n)
		}
	})
}

func TestDedupByPayload(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	dedup := func(kind, payload string) task.NewTask {
		return task.NewTask{Kind: kind, Payload: json.RawMessage(payload), DedupByPayload: true}
	}
	mustCreate := func(t *testing.T, nt task.NewTask) task.CreateResult {
		t.Helper()
		r, err := b.store.Create(b.ctx, nt)
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		return r
	}

	t.Run("SemanticallyEqualJSON", func(t *testing.T) {
		t.Parallel()
		first := mustCreate(t, dedup("eq", `{"a":1,"b":[1,2],"c":{"x":"é","y":null}}`))
		again := mustCreate(t, dedup("eq", " {\n \"c\": {\"y\": null, \"x\": \"\\u00e9\"},\t\"b\" : [1, 2], \"a\":1 } "))
		if first.Existing || !again.Existing || again.Task.ID != first.Task.ID {
			t.Fatalf("equal payloads: %+v then %+v; want the second Existing with the first's id", first, again)
		}
		if first.Task.PayloadSHA == "" || again.Task.PayloadSHA != first.Task.PayloadSHA {
			t.Fatalf("payload_sha %q vs %q", first.Task.PayloadSHA, again.Task.PayloadSHA)
		}
		if other := mustCreate(t, dedup("eq", `{"a":1,"b":[2,1],"c":{"x":"é","y":null}}`)); other.Existing {
			t.Fatalf("a different payload (array order) matched %s", other.Task.ID)
		}
		if otherKind := mustCreate(t, dedup("eq-other", `{"a":1,"b":[1,2],"c":{"x":"é","y":null}}`)); otherKind.Existing {
			t.Fatal("the same payload under another kind matched")
		}
		if optOut := mustCreate(t, task.NewTask{Kind: "eq", Payload: json.RawMessage(`{"a":1,"b":[1,2],"c":{"x":"é","y":null}}`)}); optOut.Existing {
			t.Fatal("a create without DedupByPayload matched")
		}
		if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'eq'`); n != 3 {
			t.Fatalf("%d tasks of kind eq, want 3", n)
		}
	})

	t.Run("DeadDoesNotCount", func(t *testing.T) {
		t.Parallel()
		first := mustCreate(t, dedup("dead", `{"p":1}`))
		b.start(t, "w", time.Minute, first.Task.ID, task.Started)
		b.fail(t, "w", task.Failure{ID: first.Task.ID, Error: "fatal", Permanent: true})
		second := mustCreate(t, dedup("dead", `{"p": 1}`))
		if second.Existing || second.Task.ID == first.Task.ID {
			t.Fatalf("a DEAD task with the same payload was returned: %+v", second)
		}
		third := mustCreate(t, dedup("dead", `{"p":1}`))
		if !third.Existing || third.Task.ID != second.Task.ID {
			t.Fatalf("after the new task: %+v, want it (%s)", third, second.Task.ID)
		}
	})

	t.Run("SucceededCounts", func(t *testing.T) {
		t.Parallel()
		first := mustCreate(t, dedup("done", `[1]`))
		b.start(t, "w", time.Minute, first.Task.ID, task.Started)
		if rs, err := b.store.Succeed(b.ctx, "w", first.Task.ID); err != nil || !rs[0].Applied {
			t.Fatalf("Succeed = %+v, %v", rs, err)
		}
		if again := mustCreate(t, dedup("done", `[ 1 ]`)); !again.Existing || again.Task.ID != first.Task.ID {
			t.Fatalf("a SUCCEEDED task with the same payload: %+v, want it returned (only DEAD is excluded)", again)
		}
	})

	t.Run("WithinOneBatch", func(t *testing.T) {
		t.Parallel()
		res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
			dedup("batch", `{"a":1,"b":2}`),
			dedup("batch", `{"b":2,"a":1}`),
			dedup("batch", `{"a":2}`),
		})
		if err != nil || len(res) != 3 {
			t.Fatalf("CreateBatch = %+v, %v", res, err)
		}
		if res[0].Existing || !res[1].Existing || res[1].Task.ID != res[0].Task.ID || res[2].Existing || res[2].Task.ID == res[0].Task.ID {
			t.Fatalf("batch results %+v; want item 1 to be item 0's task and item 2 new", res)
		}
		if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'batch'`); n != 2 {
			t.Fatalf("%d tasks, want 2", n)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event o JOIN ingest_task t ON t.id = o.task_id WHERE t.kind = 'batch'`); n != 2 {
			t.Fatalf("%d outbox events, want 2", n)
		}
	})

	t.Run("ConcurrentCreators", func(t *testing.T) {
		t.Parallel()
		const n = 20
		res := make([]task.CreateResult, n)
		errs := make([]error, n)
		race(n, func(i int) {
			// Same JSON, written differently by each creator.
			payload := fmt.Sprintf(`{%s"x":1,%s"y":[true]}`, strings.Repeat(" ", i), strings.Repeat("\n", i%3))
			res[i], errs[i] = b.store.Create(b.ctx, dedup("concurrent", payload))
		})
		created := 0
		for i := range res {
			if errs[i] != nil {
				t.Fatalf("creator %d: %v", i, errs[i])
			}
			if res[i].Task.ID != res[0].Task.ID {
				t.Fatalf("creators got different tasks %s and %s", res[0].Task.ID, res[i].Task.ID)
			}
			if !res[i].Existing {
				created++
			}
		}
		if created != 1 {
			t.Fatalf("%d creators report a new task, want 1", created)
		}
		if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'concurrent'`); n != 1 {
			t.Fatalf("%d tasks, want 1", n)
		}
	})
}

func TestCreateValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{MaxPayloadBytes: 64})
	tests := []struct {
		name    string
		nt      task.NewTask
		wantErr error
		wantMsg []string // each must be in the message
	}{
		{"InvalidJSON", task.NewTask{Kind: "k", Payload: json.RawMessage(`{"a":`)}, task.ErrInvalidTask, []string{"payload", "not valid JSON"}},
		{"NotJSON", task.NewTask{Kind: "k", Payload: json.RawMessage(`hello`)}, task.ErrInvalidTask, []string{"payload", "not valid JSON"}},
		{"NilPayload", task.NewTask{Kind: "k"}, task.ErrInvalidTask, []string{"payload", "empty"}},
		{"WhiteSpacePayload", task.NewTask{Kind: "k", Payload: json.RawMessage(" \n ")}, task.ErrInvalidTask, []string{"payload", "empty"}},
		{"TwoValues", task.NewTask{Kind: "k", Payload: json.RawMessage(`1 2`)}, task.ErrInvalidTask, []string{"payload", "single JSON value"}},
		{"NUL", task.NewTask{Kind: "k", Payload: json.RawMessage(`"\u0000"`)}, task.ErrInvalidTask, []string{"payload", `\u0000`}},
		{"TooLarge", task.NewTask{Kind: "k", Payload: json.RawMessage(`"` + strings.Repeat("x", 63) + `"`)}, task.ErrPayloadTooLarge, []string{"payload", "65 bytes", "limit is 64"}},
		{"NoKind", task.NewTask{Payload: json.RawMessage(`1`)}, task.ErrInvalidTask, []string{"kind"}},
		{"BlankKind", task.NewTask{Kind: "  ", Payload: json.RawMessage(`1`)}, task.ErrInvalidTask, []string{"kind"}},
		{"LongKind", task.NewTask{Kind: strings.Repeat("k", task.MaxKindLength+1), Payload: json.RawMessage(`1`)}, task.ErrInvalidTask, []string{"kind", "200"}},
		{"KindWithNUL", task.NewTask{Kind: "k\x00", Payload: json.RawMessage(`1`)}, task.ErrInvalidTask, []string{"kind"}},
		{"KindInvalidUTF8", task.NewTask{Kind: "k\xff", Payload: json.RawMessage(`1`)}, task.ErrInvalidTask, []string{"kind"}},
		{"KeyWithNUL", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), IdempotencyKey: "a\x00b"}, task.ErrInvalidTask, []string{"idempotency_key"}},
		{"KeyInvalidUTF8", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), IdempotencyKey: "a\xffb"}, task.ErrInvalidTask, []string{"idempotency_key"}},
		{"LongKey", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), IdempotencyKey: strings.Repeat("i", 1001)}, task.ErrInvalidTask, []string{"idempotency_key"}},
		{"NegativeMaxAttempts", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), MaxAttempts: -1}, task.ErrInvalidTask, []string{"max_attempts"}},
		{"RunAtAndDelay", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), RunAt: time.Now().Add(time.Hour), Delay: time.Minute}, task.ErrInvalidTask, []string{"run_at", "delay_ms", "exclusive"}},
		{"NegativeDelay", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), Delay: -time.Second}, task.ErrInvalidTask, []string{"delay_ms", "-1000"}},
		{"HugeDelay", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), Delay: task.MaxDelay + time.Millisecond}, task.ErrInvalidTask, []string{"delay_ms", "from 0 to 315619200000"}},
		{"RunAtOutOfRange", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), RunAt: time.Date(0, 12, 31, 0, 0, 0, 0, time.UTC)}, task.ErrInvalidTask, []string{"run_at", "out of range"}},
		{"RunAtBeyondHorizon", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), RunAt: time.Now().Add(task.ScheduleHorizon + time.Hour)}, task.ErrInvalidTask, []string{"run_at", "scheduling horizon", "3653 days"}},
		{"RunAtFarFuture", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), RunAt: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)}, task.ErrInvalidTask, []string{"run_at", "scheduling horizon"}},
		{"NegativeTimeout", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), Timeout: -time.Second}, task.ErrInvalidTask, []string{"timeout_ms", "-1000"}},
		{"SubMillisecondTimeout", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), Timeout: time.Microsecond}, task.ErrInvalidTask, []string{"timeout_ms", "1 ms"}},
		{"HugeTimeout", task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), Timeout: task.MaxTimeout + time.Millisecond}, task.ErrInvalidTask, []string{"timeout_ms", "from 0 to 2147483647"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := b.store.Create(b.ctx, tt.nt)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Create = %v, want %v", err, tt.wantErr)
			}
			for _, m := range tt.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Fatalf("error %q does not name %q", err, m)
				}
			}
		})
	}
	t.Run("RunAtWithinHorizon", func(t *testing.T) {
		t.Parallel()
		at := time.Now().Add(task.ScheduleHorizon - time.Minute)
		r, err := b.store.Create(b.ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), RunAt: at})
		if err != nil || r.Task.NextRetryAt == nil || !r.Task.NextRetryAt.Equal(at.Truncate(time.Microsecond)) {
			t.Fatalf("a run_at a minute inside the horizon: %+v, %v; want QUEUED with next_retry_at %v", r.Task, err, at)
		}
	})
	t.Run("LimitIsInclusive", func(t *testing.T) {
		t.Parallel()
		r, err := b.store.Create(b.ctx, task.NewTask{Kind: "limit", Payload: json.RawMessage(`"` + strings.Repeat("x", 62) + `"`)})
		if err != nil || r.Task.ID == uuid.Nil {
			t.Fatalf("a 64-byte payload with a 64-byte limit: %v", err)
		}
	})
	t.Run("DefaultLimit", func(t *testing.T) {
		t.Parallel()
		d := setup(t, task.Config{})
		big := json.RawMessage(`"` + strings.Repeat("x", task.DefaultMaxPayloadBytes) + `"`)
		if _, err := d.store.Create(d.ctx, task.NewTask{Kind: "k", Payload: big}); !errors.Is(err, task.ErrPayloadTooLarge) {
			t.Fatalf("a payload over the default limit: %v, want ErrPayloadTooLarge", err)
		}
	})
}

// TestCreateValidationWritesNothing checks that a refused create leaves no
// task, transition or outbox row.
func TestCreateValidationWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{MaxPayloadBytes: 16})
	for _, nt := range []task.NewTask{
		{Kind: "k", Payload: json.RawMessage(`{`)},
		{Kind: "k", Payload: json.RawMessage(`"` + strings.Repeat("x", 20) + `"`)},
		{Kind: "", Payload: json.RawMessage(`1`)},
		{Kind: "k\x00", Payload: json.RawMessage(`1`)},
	} {
		if _, err := b.store.Create(b.ctx, nt); err == nil {
			t.Fatalf("Create(%+v) succeeded", nt)
		}
	}
	if got := b.rows(t); got != [3]int{0, 0, 0} {
		t.Fatalf("invalid creates left %v rows", got)
	}
}

// TestDelayedCreate checks that a delayed task is QUEUED with next_retry_at
// at its due time, that its outbox row is due then too, that it cannot be
// started before, and that a run_at in the past means now.
func TestDelayedCreate(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	runAt := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "k", Payload: json.RawMessage(`1`), RunAt: runAt, Timeout: 1500 * time.Millisecond},
		{Kind: "k", Payload: json.RawMessage(`2`), Delay: 300 * time.Millisecond},
		{Kind: "k", Payload: json.RawMessage(`3`), RunAt: time.Now().Add(-time.Hour)},
		{Kind: "k", Payload: json.RawMessage(`4`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	at, delayed, past, now := res[0].Task, res[1].Task, res[2].Task, res[3].Task
	if at.Status != task.Queued || at.NextRetryAt == nil || !at.NextRetryAt.Equal(runAt) {
		t.Fatalf("run_at task: status %s next_retry_at %v, want QUEUED at %v", at.Status, at.NextRetryAt, runAt)
	}
	if at.TimeoutMS != 1500 || now.TimeoutMS != 0 {
		t.Fatalf("timeout_ms = %d and %d, want 1500 and 0 (none)", at.TimeoutMS, now.TimeoutMS)
	}
	if delayed.NextRetryAt == nil || delayed.NextRetryAt.Sub(delayed.CreatedAt) != 300*time.Millisecond {
		t.Fatalf("delay_ms task: next_retry_at %v, created %v: want 300ms after", delayed.NextRetryAt, delayed.CreatedAt)
	}
	if past.NextRetryAt != nil || now.NextRetryAt != nil {
		t.Fatalf("a past run_at and no delay must be due now (no next_retry_at): %v, %v", past.NextRetryAt, now.NextRetryAt)
	}
	// Each outbox row is due when its task is.
	for _, tk := range []task.Task{at, delayed, past, now} {
		var due, created time.Time
		if err := b.db.QueryRow(b.ctx, `SELECT next_retry_at, created_at FROM outbox_event WHERE task_id = $1`, tk.ID).Scan(&due, &created); err != nil {
			t.Fatal(err)
		}
		want := created
		if tk.NextRetryAt != nil {
			want = *tk.NextRetryAt
		}
		if !due.Equal(want) {
			t.Errorf("task %s: outbox row due %v, want %v", tk.ID, due, want)
		}
	}
	b.start(t, "w", time.Minute, at.ID, task.NotDue)
	b.start(t, "w", time.Minute, past.ID, task.Started)
	r := b.startWhenDue(t, "w", time.Minute, delayed.ID)
	if since := time.Since(delayed.CreatedAt); r.Outcome != task.Started || since < 300*time.Millisecond {
		t.Fatalf("the delayed task started (%s) %s after its creation, before its delay of 300ms", r.Outcome, since)
	}
}

// statementCounter counts the statements a pool sends, batched or not.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestCreateBatchReadsExistingTasksInOneStatement: a batch whose tasks
// lose to existing idempotency keys, or find an existing task of the same
// payload (DedupByPayload), gets each existing task back in its own
// place, read by one statement for all the keys rather than one per task:
// a batch of 10 or of 100 such tasks sends the same number of statements.
func TestCreateBatchReadsExistingTasksInOneStatement(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	counter := &statementCounter{}
	cfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := task.NewStore(task.Config{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	statements := map[int]int64{}
	for _, n := range []int{10, 100} {
		kind := fmt.Sprintf("lookup-%d", n)
		var first []task.NewTask
		for i := range n {
			first = append(first,
				task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprint(i)), IdempotencyKey: fmt.Sprint("k", i)},
				task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"d":%d}`, i)), DedupByPayload: true})
		}
		created, err := store.CreateBatch(ctx, first)
		if err != nil {
			t.Fatal(err)
		}
		// The same tasks in reverse order, and a new one.
		var again []task.NewTask
		for i := len(first) - 1; i >= 0; i-- {
			nt := first[i]
			if nt.IdempotencyKey != "" {
				nt.Payload = json.RawMessage(`"another payload"`) // the key wins
			}
			again = append(again, nt)
		}
		again = append(again, task.NewTask{Kind: kind, Payload: json.RawMessage(`"new"`), IdempotencyKey: "fresh"})
		before := counter.n.Load()
		res, err := store.CreateBatch(ctx, again)
		if err != nil {
			t.Fatal(err)
		}
		statements[n] = counter.n.Load() - before
		for i := range first {
			got, want := res[len(first)-1-i], created[i]
			if !got.Existing || got.Task.ID != want.Task.ID {
				t.Fatalf("n=%d: task %d of the repeat = %+v, want the existing task %s", n, i, got, want.Task.ID)
			}
		}
		if last := res[len(res)-1]; last.Existing || last.Task.IdempotencyKey != "fresh" {
			t.Fatalf("n=%d: the new task of the batch = %+v, want a new task", n, last)
		}
	}
	if statements[10] != statements[100] {
		t.Fatalf("a batch sent %d statements with 20 existing tasks and %d with 200: the statements grow with the tasks", statements[10], statements[100])
	}
}
