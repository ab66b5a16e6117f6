package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/task"
)

// TestSucceedWithStoresResults checks that results are written by the
// success statement, that a task without one keeps NULL, that a cancelled
// run's result is not stored, and that Succeed without results still works.
func TestSucceedWithStoresResults(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	a, c, d := b.create(t, task.NewTask{}), b.create(t, task.NewTask{}), b.create(t, task.NewTask{})
	for _, x := range []task.Task{a, c, d} {
		b.start(t, "w", time.Minute, x.ID, task.Started)
	}
	if _, err := b.store.Cancel(b.ctx, "op", "", d.ID); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.SucceedWith(b.ctx, "w",
		task.Success{ID: a.ID, Result: json.RawMessage(`{"pages": 3}`)},
		task.Success{ID: c.ID},
		task.Success{ID: d.ID, Result: json.RawMessage(`"ignored"`)})
	if err != nil || len(res) != 3 || !res[0].Applied || !res[1].Applied || !res[2].Applied {
		t.Fatalf("SucceedWith = %+v, %v", res, err)
	}
	if got := b.get(t, a.ID); got.Status != task.Succeeded || string(got.Result) != `{"pages": 3}` {
		t.Errorf("task with a result: status %s, result %s", got.Status, got.Result)
	}
	if got := b.get(t, c.ID); got.Status != task.Succeeded || got.Result != nil {
		t.Errorf("task without a result: status %s, result %s", got.Status, got.Result)
	}
	if got := b.get(t, d.ID); got.Status != task.Cancelled || got.Result != nil {
		t.Errorf("cancelled run: status %s, result %s", got.Status, got.Result)
	}
	e := b.create(t, task.NewTask{})
	b.start(t, "w", time.Minute, e.ID, task.Started)
	if res, err := b.store.Succeed(b.ctx, "w", e.ID); err != nil || !res[0].Applied {
		t.Fatalf("Succeed = %+v, %v", res, err)
	}
}

func TestCheckResult(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{MaxResultBytes: 16})
	for _, tc := range []struct {
		in, want string
		err      string
	}{
		{in: ``, want: ``},
		{in: ` null `, want: ``},
		{in: ` {"a":1} `, want: `{"a":1}`},
		{in: `{"a":`, err: "not valid JSON"},
		{in: `"0123456789abcdefgh"`, err: "20 bytes, the limit is 16"},
	} {
		got, err := b.store.CheckResult([]byte(tc.in))
		var ferr *task.FieldError
		switch {
		case tc.err != "" && (!errors.As(err, &ferr) || ferr.Field != "result" || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("CheckResult(%q) error = %v, want a result error with %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || string(got) != tc.want):
			t.Errorf("CheckResult(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := task.NewStore(task.Config{MaxResultBytes: -1}, b.db); err == nil || !strings.Contains(err.Error(), "MaxResultBytes") {
		t.Errorf("NewStore with MaxResultBytes -1: %v, want an error naming MaxResultBytes", err)
	}
}

// TestSetProgress checks the fence of a progress report (the attempt, and
// the lease when given), its validation, that it is no state change, and
// that a retry and the next start clear it while a success keeps it.
func TestSetProgress(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(5))
	x := b.create(t, task.NewTask{})
	report := func(attempt, percent int, msg, owner string) error {
		return b.store.SetProgress(b.ctx, task.ProgressReport{ID: x.ID, Attempt: attempt, Percent: percent, Message: msg, Owner: owner})
	}
	if err := report(1, 10, "", ""); !errors.Is(err, task.ErrStaleAttempt) {
		t.Fatalf("progress of a QUEUED task: %v, want ErrStaleAttempt", err)
	}
	b.start(t, "w", time.Minute, x.ID, task.Started)
	before := b.transitions(t, x.ID)
	if err := report(1, 40, "page 4 of 10", "w"); err != nil {
		t.Fatal(err)
	}
	got := b.get(t, x.ID)
	if got.Progress == nil || got.Progress.Percent != 40 || got.Progress.Message != "page 4 of 10" || got.Progress.UpdatedAt.IsZero() {
		t.Fatalf("progress = %+v", got.Progress)
	}
	if n := len(b.transitions(t, x.ID)); n != len(before) {
		t.Errorf("a progress report wrote %d audit rows", n-len(before))
	}
	for _, tc := range []struct {
		attempt, percent int
		msg, owner       string
		want             error
		field            string
	}{
		{attempt: 2, percent: 50, want: task.ErrStaleAttempt},
		{attempt: 1, percent: 50, owner: "other", want: task.ErrStaleAttempt},
		{attempt: 1, percent: 101, field: "percent"},
		{attempt: 1, percent: -1, field: "percent"},
		{attempt: 0, percent: 1, field: "attempt"},
		{attempt: 1, percent: 1, msg: strings.Repeat("x", task.MaxProgressMessageBytes+1), field: "message"},
		{attempt: 1, percent: 1, msg: "a\x00b", field: "message"},
	} {
		err := report(tc.attempt, tc.percent, tc.msg, tc.owner)
		var ferr *task.FieldError
		switch {
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%+v: %v, want %v", tc, err, tc.want)
		case tc.field != "" && (!errors.As(err, &ferr) || ferr.Field != tc.field):
			t.Errorf("%+v: %v, want an error naming %s", tc, err, tc.field)
		}
	}
	if got := b.get(t, x.ID); got.Progress == nil || got.Progress.Percent != 40 {
		t.Errorf("a refused report changed the progress: %+v", got.Progress)
	}
	if err := b.store.SetProgress(b.ctx, task.ProgressReport{ID: uuid.Must(uuid.NewV7()), Attempt: 1}); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("progress of an unknown task: %v, want ErrNotFound", err)
	}

	// A retry clears it.
	b.fail(t, "w", task.Failure{ID: x.ID, Error: "boom"})
	if got := b.get(t, x.ID); got.Status != task.Retrying || got.Progress != nil {
		t.Fatalf("after a failure: %s, progress %+v; want RETRYING without progress", got.Status, got.Progress)
	}
	b.startWhenDue(t, "w", time.Minute, x.ID)
	if err := report(1, 90, "", "w"); !errors.Is(err, task.ErrStaleAttempt) {
		t.Errorf("the first attempt's report during the second: %v, want ErrStaleAttempt", err)
	}
	if err := report(2, 100, "done", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Succeed(b.ctx, "w", x.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.get(t, x.ID); got.Progress == nil || got.Progress.Percent != 100 || got.Progress.Message != "done" {
		t.Errorf("a success kept progress %+v, want 100 done", got.Progress)
	}

	// A takeover's start clears the abandoned run's progress.
	y := b.create(t, task.NewTask{})
	b.start(t, "dead", time.Minute, y.ID, task.Started)
	if err := b.store.SetProgress(b.ctx, task.ProgressReport{ID: y.ID, Attempt: 1, Percent: 70}); err != nil {
		t.Fatal(err)
	}
	b.expireLease(t, y.ID)
	b.start(t, "w", time.Minute, y.ID, task.TakenOver)
	if got := b.get(t, y.ID); got.Progress != nil {
		t.Errorf("after a takeover: progress %+v, want none", got.Progress)
	}
}

// await registers ids as awaited for an hour, as an Awaiter's Wait does:
// their ends are announced on task.DoneChannel.
func (b *bundle) await(t *testing.T, ids ...uuid.UUID) {
	t.Helper()
	if _, err := b.db.Exec(b.ctx, `INSERT INTO ingest_task_awaited (task_id, until) SELECT unnest($1::uuid[]), now() + interval '1 hour'`, ids); err != nil {
		t.Fatal(err)
	}
}

// listenDone collects the ids announced on task.DoneChannel.
func listenDone(t *testing.T, b *bundle) (func() []uuid.UUID, func() int) {
	t.Helper()
	conn, err := b.db.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(b.ctx, "LISTEN "+pgx.Identifier{task.DoneChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	var mu sync.Mutex
	var ids []uuid.UUID
	notes := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := conn.Conn().WaitForNotification(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			notes++
			if len(n.Payload) >= 8000 {
				t.Errorf("notification of %d bytes", len(n.Payload))
			}
			for s := range strings.SplitSeq(n.Payload, ",") {
				ids = append(ids, uuid.MustParse(s))
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Release()
	})
	return func() []uuid.UUID {
			mu.Lock()
			defer mu.Unlock()
			return append([]uuid.UUID(nil), ids...)
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return notes
		}
}

// TestDoneNotification checks that a statement ending 450 awaited tasks
// announces all of them, in notifications under 8000 bytes, and that starts and
// failures that retry announce nothing.
func TestDoneNotification(t *testing.T) {
	t.Parallel()
	b := setup(t, fastRetry(5))
	ids, notes := listenDone(t, b)
	var tasks []task.NewTask
	for i := range 450 {
		tasks = append(tasks, task.NewTask{Kind: "n", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	created, err := b.store.CreateBatch(b.ctx, tasks)
	if err != nil {
		t.Fatal(err)
	}
	var all []uuid.UUID
	for _, c := range created {
		all = append(all, c.Task.ID)
	}
	b.await(t, all...)
	if _, err := b.store.Start(b.ctx, "w", time.Minute, all...); err != nil {
		t.Fatal(err)
	}
	retry := all[0]
	if _, err := b.store.Fail(b.ctx, "w", task.Failure{ID: retry, Error: "again"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Succeed(b.ctx, "w", all[1:]...); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "449 announced ids", func() bool { return len(ids()) >= 449 })
	got := map[uuid.UUID]bool{}
	for _, id := range ids() {
		got[id] = true
	}
	if len(got) != 449 || got[retry] {
		t.Errorf("announced %d distinct ids (the retried task among them: %v), want the 449 that succeeded", len(got), got[retry])
	}
	if n := notes(); n != 3 {
		t.Errorf("%d notifications, want 3 (200 ids each at most)", n)
	}
}

// TestAwaiter checks that a waiter is woken by the notification of its
// task's end (the fallback check is an hour away), that many waiters share
// one connection, that a wait that ends first returns the task as it is,
// and that an unknown task is ErrNotFound. It logs the latency from the
// success's commit to the waiter's return.
func TestAwaiter(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	aw := task.NewAwaiter(b.store, nil)
	aw.Fallback, aw.Poll = time.Hour, time.Hour
	t.Cleanup(aw.Close)

	q := b.create(t, task.NewTask{})
	// Long enough for the wait's first read on a slow machine: a wait cut
	// off before it returns no task.
	short, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	defer cancel()
	if got, err := aw.Wait(short, q.ID); !errors.Is(err, context.DeadlineExceeded) || got.ID != q.ID || got.Status != task.Queued {
		t.Errorf("wait that ended first = %s %s, %v; want the QUEUED task and DeadlineExceeded", got.ID, got.Status, err)
	}
	if _, err := aw.Wait(b.ctx, uuid.Must(uuid.NewV7())); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("wait for an unknown task: %v, want ErrNotFound", err)
	}

	var lat []time.Duration
	for range 10 {
		const waiters = 5
		x := b.create(t, task.NewTask{})
		b.start(t, "w", time.Minute, x.ID, task.Started)
		type ret struct {
			t   task.Task
			err error
			at  time.Time
		}
		out := make(chan ret, waiters)
		ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
		for range waiters {
			go func() {
				got, err := aw.Wait(ctx, x.ID)
				out <- ret{got, err, time.Now()}
			}()
		}
		// The waiters are registered and listening once the connection
		// is open; a notification before that is covered by the wake-up
		// at LISTEN, which re-reads every awaited task.
		testenv.Eventually(t, 10*time.Second, "listener connection", func() bool {
			return b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ingest-task-awaiter'`) == 1
		})
		// Each Wait registers its task, so that its end is announced.
		testenv.Eventually(t, 10*time.Second, "the task registered as awaited", func() bool {
			return b.count(t, fmt.Sprintf(`SELECT count(*) FROM ingest_task_awaited WHERE task_id = '%s' AND until > now()`, x.ID)) == 1
		})
		if _, err := b.store.SucceedWith(b.ctx, "w", task.Success{ID: x.ID, Result: json.RawMessage(`[1]`)}); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		for range waiters {
			r := <-out
			if r.err != nil || r.t.Status != task.Succeeded || string(r.t.Result) != `[1]` {
				t.Fatalf("Wait = %s %s, %v; want SUCCEEDED with its result before the deadline", r.t.Status, r.t.Result, r.err)
			}
			lat = append(lat, r.at.Sub(committed))
		}
		cancel()
	}
	if n := b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ingest-task-awaiter'`); n != 1 {
		t.Errorf("%d awaiter connections, want 1", n)
	}
	slices.Sort(lat)
	t.Logf("commit → waiter returned over %d waits: p50 %s, max %s", len(lat), lat[len(lat)/2], lat[len(lat)-1])
}

// TestAwaiterFallback checks that waits end without a LISTEN (behind a
// pooler without a direct connection), through the state check.
func TestAwaiterFallback(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	s, err := task.NewStore(task.Config{Listen: pgsession.Source{None: true}}, db)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{ctx: context.Background(), db: db, store: s}
	aw := task.NewAwaiter(s, nil)
	aw.Poll = 20 * time.Millisecond
	t.Cleanup(aw.Close)
	x := b.create(t, task.NewTask{})
	b.start(t, "w", time.Minute, x.ID, task.Started)
	done := make(chan error, 1)
	go func() {
		_, err := aw.Wait(b.ctx, x.ID)
		done <- err
	}()
	if _, err := s.Succeed(b.ctx, "w", x.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end through the state check")
	}
}
