package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// kill creates n tasks of kind and runs each once to DEAD with error msg;
// it returns their ids.
func (b *bundle) kill(t *testing.T, kind, msg string, n int) []uuid.UUID {
	t.Helper()
	var ids []uuid.UUID
	for done := 0; done < n; done += 1000 {
		nts := make([]task.NewTask, min(1000, n-done))
		for i := range nts {
			nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, done+i))}
		}
		res, err := b.store.CreateBatch(b.ctx, nts)
		if err != nil {
			t.Fatal(err)
		}
		batch := make([]uuid.UUID, len(res))
		fails := make([]task.Failure, len(res))
		for i, r := range res {
			batch[i] = r.Task.ID
			fails[i] = task.Failure{ID: r.Task.ID, Error: msg, Permanent: true}
		}
		if _, err := b.store.Start(b.ctx, "runner", time.Minute, batch...); err != nil {
			t.Fatal(err)
		}
		rs, err := b.store.Fail(b.ctx, "runner", fails...)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.Status != task.Dead {
				t.Fatalf("task %s is %s after a permanent failure, want DEAD", r.ID, r.Status)
			}
		}
		ids = append(ids, batch...)
	}
	return ids
}

// TestRedriveMatchingFilters: each filter field selects exactly its tasks;
// a dry run changes nothing; a real run moves the matched tasks to QUEUED
// with an audit row naming the actor, and leaves the others alone.
func TestRedriveMatchingFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	upstreamA := b.kill(t, "a", "embed: upstream 503", 3)
	badA := b.kill(t, "a", "bad input", 2)
	upstreamB := b.kill(t, "b", "embed: upstream 503", 2)
	cancelled := b.create(t, task.NewTask{Kind: "a"}).ID
	b.cancel(t, cancelled, "", task.CancelDone)
	queued := b.create(t, task.NewTask{Kind: "a"}).ID

	redrive := func(f task.RedriveFilter, dry bool) task.BulkRedriveResult {
		t.Helper()
		res, err := b.store.RedriveMatching(b.ctx, "api:test", f, task.RedriveOptions{DryRun: dry})
		if err != nil {
			t.Fatalf("RedriveMatching(%+v): %v", f, err)
		}
		return res
	}
	newestFirst := func(ids []uuid.UUID) []uuid.UUID {
		out := slices.Clone(ids)
		slices.Reverse(out) // created in order; UUIDv7 and created_at grow
		return out
	}
	filter := task.RedriveFilter{Status: task.Dead, Kind: "a", ErrorContains: "503"}

	dry := redrive(filter, true)
	if dry.Matched != 3 || dry.Redriven != 0 || !slices.Equal(dry.IDs, newestFirst(upstreamA)) {
		t.Fatalf("dry run = %+v, want matched 3, redriven 0, ids %v", dry, newestFirst(upstreamA))
	}
	for _, id := range upstreamA {
		if s := b.get(t, id).Status; s != task.Dead {
			t.Fatalf("dry run changed task %s to %s", id, s)
		}
	}

	res := redrive(filter, false)
	if res.Matched != 3 || res.Redriven != 3 || !slices.Equal(res.IDs, newestFirst(upstreamA)) {
		t.Fatalf("redrive = %+v, want matched and redriven 3", res)
	}
	for _, id := range upstreamA {
		tk := b.get(t, id)
		rec := b.lastTransition(t, id)
		if tk.Status != task.Queued || tk.AttemptCount != 0 || rec.From != string(task.Dead) || rec.To != string(task.Queued) ||
			rec.Worker != "api:test" || rec.Message != "redrive" {
			t.Fatalf("task %s after redrive: %s attempt %d, last transition %+v", id, tk.Status, tk.AttemptCount, rec)
		}
	}
	for _, id := range slices.Concat(badA, upstreamB) {
		if s := b.get(t, id).Status; s != task.Dead {
			t.Fatalf("task %s outside the filter is %s, want DEAD", id, s)
		}
	}
	if again := redrive(filter, false); again.Matched != 0 || again.Redriven != 0 {
		t.Fatalf("second redrive = %+v, want nothing left to match", again)
	}

	if r := redrive(task.RedriveFilter{Status: task.Dead, ErrorContains: "503"}, true); !slices.Equal(r.IDs, newestFirst(upstreamB)) {
		t.Fatalf("any kind, error 503: %v, want %v", r.IDs, newestFirst(upstreamB))
	}
	if r := redrive(task.RedriveFilter{Status: task.Dead, Limit: 1}, true); r.Matched != 1 || r.IDs[0] != upstreamB[1] {
		t.Fatalf("limit 1: %+v, want the newest DEAD task %s", r, upstreamB[1])
	}
	future := time.Now().Add(time.Hour)
	if r := redrive(task.RedriveFilter{Status: task.Dead, Since: future}, true); r.Matched != 0 {
		t.Fatalf("since an hour ahead: %+v, want nothing", r)
	}
	if r := redrive(task.RedriveFilter{Status: task.Dead, Until: future}, true); r.Matched != 4 {
		t.Fatalf("until an hour ahead: %+v, want the 4 DEAD tasks", r)
	}
	if r := redrive(task.RedriveFilter{Status: task.Cancelled}, false); r.Redriven != 1 || r.IDs[0] != cancelled {
		t.Fatalf("cancelled: %+v, want %s redriven", r, cancelled)
	}
	if s := b.get(t, queued).Status; s != task.Queued {
		t.Fatalf("untouched QUEUED task is %s", s)
	}
}

// TestRedriveFilterValidate: a bad filter is refused with an error naming
// the field, before anything is read.
func TestRedriveFilterValidate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		f    task.RedriveFilter
		want string
	}{
		{task.RedriveFilter{}, "status"},
		{task.RedriveFilter{Status: task.Queued}, "status"},
		{task.RedriveFilter{Status: task.Dead, Limit: -1}, "limit"},
		{task.RedriveFilter{Status: task.Dead, Limit: task.MaxRedriveLimit + 1}, "limit"},
		{task.RedriveFilter{Status: task.Dead, Since: now, Until: now}, "since"},
		{task.RedriveFilter{Status: task.Dead, ErrorContains: "a\x00b"}, "error_contains"},
	} {
		err := tc.f.WithDefaults().Validate()
		if !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an ErrInvalidTask naming %s", tc.f, err, tc.want)
		}
	}
	if err := (task.RedriveFilter{Status: task.Cancelled}).WithDefaults().Validate(); err != nil {
		t.Errorf("a CANCELLED filter with defaults: %v", err)
	}
}

// TestRedriveMatchingTenThousand: 10,000 DEAD tasks, a dry run first, then
// the redrive: every one QUEUED with a new outbox event, in batches paced
// at the given rate.
func TestRedriveMatchingTenThousand(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	const n = 10000
	b.kill(t, "bulk", "upstream down", n)
	f := task.RedriveFilter{Status: task.Dead, Kind: "bulk", Limit: n}
	dry, err := b.store.RedriveMatching(b.ctx, "cli:test", f, task.RedriveOptions{DryRun: true})
	if err != nil || dry.Matched != n || len(dry.IDs) != n || dry.Redriven != 0 {
		t.Fatalf("dry run: matched %d, %d ids, redriven %d, %v; want %d matched", dry.Matched, len(dry.IDs), dry.Redriven, err, n)
	}
	if got := b.count(t, `SELECT count(*) FROM ingest_task WHERE status = 'DEAD'`); got != n {
		t.Fatalf("after the dry run %d DEAD, want %d", got, n)
	}
	var batches []int
	res, err := b.store.RedriveMatching(b.ctx, "cli:test", f, task.RedriveOptions{Batch: 1000, Rate: 1e6,
		Redriven: func(_ context.Context, res []task.Result) error {
			batches = append(batches, len(task.Redriven(res)))
			return nil
		}})
	if err != nil || res.Matched != n || res.Redriven != n {
		t.Fatalf("redrive: %+v (ids elided) %v", task.BulkRedriveResult{Matched: res.Matched, Redriven: res.Redriven}, err)
	}
	if len(batches) != 10 || slices.ContainsFunc(batches, func(k int) bool { return k != 1000 }) {
		t.Fatalf("batches %v, want 10 of 1000", batches)
	}
	if got := b.count(t, `SELECT count(*) FROM ingest_task WHERE status = 'QUEUED' AND kind = 'bulk'`); got != n {
		t.Fatalf("%d QUEUED after the redrive, want %d", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM outbox_event`); got != 2*n {
		t.Fatalf("%d outbox events, want %d (create and redrive)", got, 2*n)
	}
	if got := b.count(t, `SELECT count(*) FROM ingest_task_transition WHERE message = 'redrive' AND worker = 'cli:test'`); got != n {
		t.Fatalf("%d redrive audit rows by cli:test, want %d", got, n)
	}
}

// TestRedriveMatchingPaced: batches wait for the rate: 50 tasks in
// batches of 10 at 100 tasks/s cannot finish before the fifth batch's
// turn, 0.4 s after the start.
func TestRedriveMatchingPaced(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	b.kill(t, "paced", "x", 50)
	begun := time.Now()
	res, err := b.store.RedriveMatching(b.ctx, "cli:test", task.RedriveFilter{Status: task.Dead},
		task.RedriveOptions{Batch: 10, Rate: 100})
	if err != nil || res.Redriven != 50 {
		t.Fatalf("redrive: redriven %d, %v", res.Redriven, err)
	}
	if took := time.Since(begun); took < 400*time.Millisecond {
		t.Fatalf("50 tasks at 100/s in batches of 10 took %s, want at least 400ms", took)
	}
}
