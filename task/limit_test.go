package task_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want task.Rate
		text string
	}{
		{"5/s", task.Rate{Count: 5, Per: time.Second}, "5/s"},
		{" 300/m ", task.Rate{Count: 300, Per: time.Minute}, "300/m"},
		{"1000/h", task.Rate{Count: 1000, Per: time.Hour}, "1000/h"},
		{"10/500ms", task.Rate{Count: 10, Per: 500 * time.Millisecond}, "10/500ms"},
		{"7/2s", task.Rate{Count: 7, Per: 2 * time.Second}, "7/2s"},
		{"0", task.Rate{}, "0"},
		{"", task.Rate{}, "0"},
		{"0/s", task.Rate{}, "0"},
	} {
		got, err := task.ParseRate(tc.in)
		if err != nil || got != tc.want || got.String() != tc.text {
			t.Errorf("ParseRate(%q) = %+v (%q), %v; want %+v (%q)", tc.in, got, got.String(), err, tc.want, tc.text)
		}
	}
	for _, bad := range []string{"5", "five/s", "-1/s", "5/fortnight", "5/0s", "5/-1s", "5/1us", "100001/s", "5/48h"} {
		_, err := task.ParseRate(bad)
		var ferr *task.FieldError
		if !errors.As(err, &ferr) || ferr.Field != "rate" {
			t.Errorf("ParseRate(%q) = %v, want a FieldError naming rate", bad, err)
		}
	}
	// A count no integer holds names the range too.
	if _, err := task.ParseRate("99999999999999999999/s"); err == nil || !strings.Contains(err.Error(), "from 0 to 10000") {
		t.Errorf("ParseRate of a count beyond int64: %v, want the range named", err)
	}
}

// outcomes counts the results of a StartLimited call by outcome, and
// returns the started ids.
func outcomes(rs []task.StartResult) (map[task.StartOutcome]int, []uuid.UUID) {
	n := map[task.StartOutcome]int{}
	var started []uuid.UUID
	for _, r := range rs {
		n[r.Outcome]++
		if r.Outcome == task.Started {
			started = append(started, r.ID)
		}
	}
	return n, started
}

// TestConcurrencyLimit: a kind limited to 2 starts 2 of 5 tasks and parks
// the other 3 (no attempt counted); a finished run frees its slot, an
// expired lease frees its slot, and ReleaseParked wakes as many parked
// tasks as there are free slots, less those in transit.
func TestConcurrencyLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	conc := 2
	if _, err := b.store.SetKind(b.ctx, "test", "c", task.KindUpdate{Concurrency: &conc}); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for range 5 {
		ids = append(ids, b.create(t, task.NewTask{Kind: "c"}).ID)
	}
	rs, err := b.store.StartLimited(b.ctx, "w1", time.Minute, "c", ids...)
	if err != nil {
		t.Fatal(err)
	}
	n, started := outcomes(rs)
	if n[task.Started] != 2 || n[task.ParkedAtLimit] != 3 {
		t.Fatalf("StartLimited = %v, want 2 started and 3 throttled", n)
	}
	for _, r := range rs {
		if r.Outcome == task.ParkedAtLimit {
			if tk := b.get(t, r.ID); !tk.Parked() || tk.AttemptCount != 0 || tk.ParkedNote() != "waiting for a slot" {
				t.Fatalf("throttled task %s: row %+v; want parked with no attempt", r.ID, tk)
			}
		}
	}
	if got, err := b.store.ReleaseParked(b.ctx, "c", 0, 0); err != nil || len(got) != 0 {
		t.Fatalf("ReleaseParked with every slot taken = %v, %v", got, err)
	}
	// A finished run frees its slot: one parked task is released.
	if rs, err := b.store.Succeed(b.ctx, "w1", started[0]); err != nil || !rs[0].Applied {
		t.Fatalf("Succeed = %v, %v", rs, err)
	}
	woken, err := b.store.ReleaseParked(b.ctx, "c", 0, 0)
	if err != nil || len(woken) != 1 {
		t.Fatalf("ReleaseParked after a success = %v, %v; want 1", woken, err)
	}
	if got, err := b.store.ReleaseParked(b.ctx, "c", 1, 0); err != nil || len(got) != 0 {
		t.Fatalf("ReleaseParked with the free slot's task in transit = %v, %v; want none", got, err)
	}
	if tk := b.get(t, woken[0]); tk.Parked() || tk.NextRetryAt != nil {
		t.Fatalf("released task %+v, want due", tk)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, woken[0]); n != 2 {
		t.Fatalf("released task has %d outbox events, want 2", n)
	}
	// Every start of the kind goes through its limit: a plain Start of a
	// parked task finds it not due.
	b.start(t, "w2", time.Minute, ids[4], task.Parked)
	rs, err = b.store.StartLimited(b.ctx, "w2", time.Minute, "c", woken[0])
	if n, _ := outcomes(rs); err != nil || n[task.Started] != 1 {
		t.Fatalf("the released task: %v, %v; want started", n, err)
	}
	// An expired lease frees its slot too (the lease ran out long after
	// the slot was reserved).
	b.expireLease(t, started[1])
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_kind_slot SET reserved_at = now() - interval '1 minute' WHERE task_id = $1`, started[1]); err != nil {
		t.Fatal(err)
	}
	if woken, err = b.store.ReleaseParked(b.ctx, "c", 0, 0); err != nil || len(woken) != 1 {
		t.Fatalf("ReleaseParked after a lease expired = %v, %v; want 1", woken, err)
	}
	// The expired task's takeover needs a slot as any start: the released
	// task took it, so the takeover is throttled and not parked.
	rs, err = b.store.StartLimited(b.ctx, "w2", time.Minute, "c", woken[0], started[1])
	if err != nil || rs[0].Outcome != task.Started || rs[1].Outcome != task.Throttled {
		t.Fatalf("released task and takeover: %+v, %v; want started, then throttled unparked", rs, err)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'c' AND status = 'RUNNING' AND lease_until > now()`); n != 2 {
		t.Fatalf("%d tasks of c running under a live lease, want 2", n)
	}
	// Removing the limit releases every parked task.
	zero := 0
	released, err := b.store.SetKind(b.ctx, "test", "c", task.KindUpdate{Concurrency: &zero})
	if err != nil || released != 1 {
		t.Fatalf("removing the limit released %d, %v; want 1", released, err)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_kind_change WHERE kind = 'c' AND actor = 'test'`); n != 2 {
		t.Fatalf("%d changes recorded, want 2", n)
	}
}

// TestRateLimit: a kind limited to 3 starts per 400 ms starts 3 of 5 and
// parks 2; nothing is released before the window passed, then 2 are; the
// rate log counts each start, at the start's audit time.
func TestRateLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	rate := task.Rate{Count: 3, Per: 400 * time.Millisecond}
	if _, err := b.store.SetKind(b.ctx, "test", "r", task.KindUpdate{Rate: &rate}); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for range 5 {
		ids = append(ids, b.create(t, task.NewTask{Kind: "r"}).ID)
	}
	first := time.Now()
	rs, err := b.store.StartLimited(b.ctx, "w1", time.Minute, "r", ids...)
	if n, _ := outcomes(rs); err != nil || n[task.Started] != 3 || n[task.ParkedAtLimit] != 2 {
		t.Fatalf("StartLimited = %v, %v; want 3 started and 2 throttled", n, err)
	}
	if n := b.count(t, `SELECT sum(n) FROM ingest_kind k, unnest(k.rate_log, k.rate_log_n) AS x(at, n)
		WHERE k.kind = 'r' AND at IN (SELECT created_at FROM ingest_task_transition WHERE to_status = 'RUNNING')`); n != 3 {
		t.Fatalf("the rate log holds %d starts at a start's audit time, want 3", n)
	}
	var woken []uuid.UUID
	testenv.Eventually(t, 5*time.Second, "the parked tasks released", func() bool {
		got, err := b.store.ReleaseParked(b.ctx, "r", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 && time.Since(first) < rate.Per {
			t.Fatalf("released %d tasks %s after the first starts, within the window", len(got), time.Since(first))
		}
		woken = append(woken, got...)
		return len(woken) == 2
	})
	rs, err = b.store.StartLimited(b.ctx, "w1", time.Minute, "r", woken...)
	if n, _ := outcomes(rs); err != nil || n[task.Started] != 2 {
		t.Fatalf("released tasks: %v, %v; want 2 started", n, err)
	}
}

// TestRateLogKeepsWhatAStaleTransactionCounts: a transaction that began
// before another committed starts logged more than the margin later
// (it waited for the kind's lock, or its client was slow) gets no start.
// The younger transaction dropped the log's elements older than its own
// window and margin, which the stale one's window still covers: counting
// without them let it start a second full rate's worth in one window.
// Both the kind's rate and a per-group rate are checked.
func TestRateLogKeepsWhatAStaleTransactionCounts(t *testing.T) {
	t.Parallel()
	rate := task.Rate{Count: 5, Per: 300 * time.Millisecond}
	for name, upd := range map[string]task.KindUpdate{"kind": {Rate: &rate}, "group": {RatePerGroup: &rate}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, task.Config{})
			if _, err := b.store.SetKind(b.ctx, "test", "r", upd); err != nil {
				t.Fatal(err)
			}
			var ids []uuid.UUID
			for _, tk := range groupTasks(t, b, "r", "g", 12) {
				ids = append(ids, tk.ID)
			}
			rs, err := b.store.StartLimited(b.ctx, "w1", time.Minute, "r", ids[:5]...)
			if n, _ := outcomes(rs); err != nil || n[task.Started] != 5 {
				t.Fatalf("first starts: %v, %v; want 5 started", n, err)
			}
			stale, err := b.db.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = stale.Rollback(b.ctx) }()
			var began time.Time
			if err := stale.QueryRow(b.ctx, `SELECT now()`).Scan(&began); err != nil {
				t.Fatal(err)
			}
			// A younger transaction starts one task once the first starts
			// are past its window and the margin: it drops them from the log.
			past := began.Add(rate.Per + task.RateLogMargin + 50*time.Millisecond)
			testenv.Eventually(t, 30*time.Second, "the database clock past the window and the margin", func() bool {
				return b.count(t, `SELECT count(*) FROM (SELECT clock_timestamp() > $1) AS x(p) WHERE p`, past) == 1
			})
			rs, err = b.store.StartLimited(b.ctx, "w1", time.Minute, "r", ids[5])
			if n, _ := outcomes(rs); err != nil || n[task.Started] != 1 {
				t.Fatalf("younger start: %v, %v; want 1 started", n, err)
			}
			chosen, err := task.ReserveInTx(b.ctx, stale, "r", ids[6:])
			if err != nil {
				t.Fatal(err)
			}
			if len(chosen) != 0 {
				t.Errorf("a transaction begun with 5 starts in its window (limit %s) reserved %d more", rate, len(chosen))
			}
		})
	}
}

// TestStartLimitedPausedAndForeign: a paused kind starts nothing through
// StartLimited (all parked); a task whose row has another kind than its
// entry says is started without the limit.
func TestStartLimitedPausedAndForeign(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	one, yes := 1, true
	if _, err := b.store.SetKind(b.ctx, "test", "p", task.KindUpdate{Concurrency: &one, Paused: &yes}); err != nil {
		t.Fatal(err)
	}
	p1, p2 := b.create(t, task.NewTask{Kind: "p"}).ID, b.create(t, task.NewTask{Kind: "p"}).ID
	foreign := b.create(t, task.NewTask{Kind: "other"}).ID
	rs, err := b.store.StartLimited(b.ctx, "w", time.Minute, "p", p1, foreign, p2)
	if err != nil || rs[0].Outcome != task.ParkedAtLimit || rs[1].Outcome != task.Started || rs[2].Outcome != task.ParkedAtLimit {
		t.Fatalf("StartLimited = %+v, %v; want p parked, the foreign task started", rs, err)
	}
	// Resuming a limited kind releases what its limit lets start.
	no := false
	released, err := b.store.SetKind(b.ctx, "test", "p", task.KindUpdate{Paused: &no})
	if err != nil || released != 1 {
		t.Fatalf("resume released %d, %v; want 1 (concurrency 1)", released, err)
	}
}

// TestConcurrencyLimitUnderRacingStarters: eight starters on separate
// connections race to start 200 tasks of a kind limited to 3, finishing
// each run at once; at no moment do more than 3 tasks of the kind run
// (checked after every start from the rows), and all 200 succeed.
func TestConcurrencyLimitUnderRacingStarters(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	limit := 3
	if _, err := b.store.SetKind(b.ctx, "test", "c", task.KindUpdate{Concurrency: &limit}); err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for range 200 {
		ids = append(ids, b.create(t, task.NewTask{Kind: "c"}).ID)
	}
	var (
		mu      sync.Mutex
		maxLive int
		next    = ids
	)
	take := func() []uuid.UUID {
		mu.Lock()
		defer mu.Unlock()
		n := min(len(next), 5)
		out := next[:n]
		next = next[n:]
		return out
	}
	giveBack := func(id uuid.UUID) { mu.Lock(); next = append(next, id); mu.Unlock() }
	var wg sync.WaitGroup
	for w := range 8 {
		owner := "w" + string(rune('a'+w))
		wg.Go(func() {
			for {
				batch := take()
				if len(batch) == 0 {
					if b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'c' AND status <> 'SUCCEEDED'`) == 0 {
						return
					}
					woken, err := b.store.ReleaseParked(b.ctx, "c", 0, 0)
					if err != nil {
						t.Error(err)
						return
					}
					for _, id := range woken {
						giveBack(id)
					}
					continue
				}
				rs, err := b.store.StartLimited(b.ctx, owner, time.Minute, "c", batch...)
				if err != nil {
					t.Error(err)
					return
				}
				live := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'c' AND status = 'RUNNING'`)
				mu.Lock()
				maxLive = max(maxLive, live)
				mu.Unlock()
				for _, r := range rs {
					switch {
					case r.Outcome == task.Started || r.Outcome == task.TakenOver:
						if res, err := b.store.Succeed(b.ctx, owner, r.ID); err != nil || !res[0].Applied {
							t.Errorf("Succeed %s = %v, %v", r.ID, res, err)
						}
					case r.Outcome == task.Throttled:
						giveBack(r.ID)
					}
				}
			}
		})
	}
	wg.Wait()
	if maxLive > limit {
		t.Fatalf("up to %d tasks of the kind ran at once, limit %d", maxLive, limit)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = 'c' AND status = 'SUCCEEDED' AND attempt_count = 0`); n != 200 {
		t.Fatalf("%d of 200 tasks SUCCEEDED at their first attempt", n)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task_transition WHERE to_status = 'RUNNING'`); n != 200 {
		t.Fatalf("%d starts audited, want 200", n)
	}
}
