//go:build reliability

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// stop SIGTERMs the process (a graceful stop) and keeps it down.
func (p *proc) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	<-p.signal(syscall.SIGTERM)
}

// TestSchedulingUnderKills: delayed, cancelled and periodic tasks, and a
// paused kind resumed mid-run, while a random worker of four is SIGKILLed
// every ~2 s (scenario 9). No task of the paused kind runs before the
// resume, and all run after it. No delayed
// task runs before its time; every cancel ends CANCELLED (a waiting task at
// once, a running one when its handler is cut off, also when its worker is
// killed), with no effect of a task cancelled while waiting; the periodic
// schedule (every second, on whichever process leads) gets one task per
// slot, no gap longer than a leader failover and no burst; kinds limited
// per kind, and grouped tasks limited per group (groups_test.go), never
// exceed their limits and a burst group does not starve the quiet ones;
// and the usual invariants hold (nothing lost or stuck, duplicates within
// the bound).
func TestSchedulingUnderKills(t *testing.T) {
	c := newCluster(t, clusterOptions{env: []string{`CHAOS_PERIODIC=[{"kind":"tick","every":"1s"}]`}})
	ctx := context.Background()
	start := time.Now()
	// A paused kind: its tasks are parked until the resume below.
	if _, err := c.store.SetPaused(ctx, "chaos", "held", true); err != nil {
		t.Fatal(err)
	}
	// Limited kinds: at most 3 capped tasks running, at most 10 rated
	// starts in any second, across the workers.
	capN, rate := 3, task.Rate{Count: 10, Per: time.Second}
	if _, err := c.store.SetKind(ctx, "chaos", "capped", task.KindUpdate{Concurrency: &capN}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.store.SetKind(ctx, "chaos", "rated", task.KindUpdate{Rate: &rate}); err != nil {
		t.Fatal(err)
	}
	// A kind limited per group (groups_test.go), set before the workers
	// start like the limits above.
	groups := newGroupLoad(t, c)
	ws := c.spawn("w", 4)
	seconds := size(10, 60)
	span := time.Duration(seconds) * time.Second

	// Delayed tasks, due at times spread over the run.
	nDelayed := size(500, 3000)
	due := map[uuid.UUID]time.Time{}
	for done := 0; done < nDelayed; done += 500 {
		nts := make([]task.NewTask, min(500, nDelayed-done))
		for i := range nts {
			at := start.Add(time.Second + span*time.Duration(done+i)/time.Duration(nDelayed))
			p, _ := json.Marshal(map[string]any{"ms": 20})
			nts[i] = task.NewTask{Kind: "ok", Payload: p, RunAt: at, MaxAttempts: 50}
		}
		res, err := c.store.CreateBatch(ctx, nts)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			due[r.Task.ID] = nts[i].RunAt
		}
	}
	// Cancel targets: long tasks that will be running, and tasks due in an
	// hour (waiting).
	create := func(n int, ms int, runAt time.Time) []uuid.UUID {
		t.Helper()
		nts := make([]task.NewTask, n)
		for i := range nts {
			p, _ := json.Marshal(map[string]any{"ms": ms})
			nts[i] = task.NewTask{Kind: "ok", Payload: p, RunAt: runAt, MaxAttempts: 50}
		}
		res, err := c.store.CreateBatch(ctx, nts)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]uuid.UUID, n)
		for i, r := range res {
			ids[i] = r.Task.ID
		}
		return ids
	}
	long := create(size(40, 200), 4000, time.Time{})
	held := make([]task.NewTask, size(100, 500))
	for i := range held {
		held[i] = task.NewTask{Kind: "held", Payload: json.RawMessage(`{"ms":20}`), MaxAttempts: 50}
	}
	if _, err := c.store.CreateBatch(ctx, held); err != nil {
		t.Fatal(err)
	}
	var resumedAt time.Time
	later := create(size(20, 100), 20, start.Add(time.Hour))
	limited := func(kind string, n, ms int) {
		nts := make([]task.NewTask, n)
		for i := range nts {
			p, _ := json.Marshal(map[string]any{"ms": ms})
			nts[i] = task.NewTask{Kind: kind, Payload: p, MaxAttempts: 50}
		}
		if _, err := c.store.CreateBatch(ctx, nts); err != nil {
			t.Fatal(err)
		}
	}
	nCapped, nRated := size(60, 300), size(60, 400)
	limited("capped", nCapped, 100)
	limited("rated", nRated, 5)
	// Grouped tasks (groups_test.go): a burst now, a group's delayed
	// tasks due together soon, quiet groups a few tasks per kill.
	groups.createBurst()

	outcomes := map[uuid.UUID]task.CancelOutcome{}
	cancel := func(ids []uuid.UUID) {
		for _, id := range ids {
			r, err := c.store.Cancel(ctx, "chaos", "scenario 9", id)
			if err != nil {
				t.Errorf("cancel %s: %v", id, err)
				continue
			}
			outcomes[id] = r.Outcome
		}
	}
	cancelled := false
	for time.Since(start) < span {
		time.Sleep(1500*time.Millisecond + rand.N(time.Second))
		if !cancelled {
			// Half the long tasks (most of them running by now) and
			// every waiting one; the other half runs to its end.
			cancelled = true
			cancel(long[:len(long)/2])
			cancel(later)
		} else if resumedAt.IsZero() {
			resumedAt = time.Now()
			if _, err := c.store.SetPaused(ctx, "chaos", "held", false); err != nil {
				t.Fatal(err)
			}
		}
		groups.round()
		ws[rand.IntN(len(ws))].kill()
	}
	for !groups.round() { // a run shorter than the quiet groups' rounds
	}

	// The schedule stops with the processes that have it: they stop
	// gracefully, and two workers without it finish what is left.
	for _, w := range ws {
		w.stop()
	}
	c.spawn("f", 2, "CHAOS_PERIODIC=")
	r := c.finish(row{Scenario: "9. delayed, cancelled, periodic, paused and limited tasks, SIGKILL every 2 s (4 workers)"}, expect{}, start)

	// Delayed: no run before its time.
	early := 0
	rows, err := c.db.Pool.Query(ctx, `SELECT task_id, min(run_at) FROM chaos_effect GROUP BY task_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		if d, ok := due[id]; ok && at.Before(d) {
			early++
			t.Errorf("delayed task %s ran at %s, before its time %s", id, at.Format(time.RFC3339Nano), d.Format(time.RFC3339Nano))
		}
	}

	// Paused: no task of the held kind ran before the resume (the
	// invariants above saw every one SUCCEEDED).
	var heldEarly int
	if err := c.db.Pool.QueryRow(ctx, `SELECT count(*) FROM chaos_effect e JOIN ingest_task t ON t.id = e.task_id
		WHERE t.kind = 'held' AND e.run_at < $1`, resumedAt).Scan(&heldEarly); err != nil {
		t.Fatal(err)
	}
	if heldEarly > 0 || resumedAt.IsZero() {
		t.Errorf("%d runs of the paused kind before its resume at %s", heldEarly, resumedAt)
	}

	// Cancels: every one ends CANCELLED; one made while waiting left no
	// effect.
	requested := 0
	for id, o := range outcomes {
		var status task.State
		var effects int
		if err := c.db.Pool.QueryRow(ctx, `SELECT status, (SELECT count(*) FROM chaos_effect WHERE task_id = $1) FROM ingest_task WHERE id = $1`, id).Scan(&status, &effects); err != nil {
			t.Fatal(err)
		}
		switch o {
		case task.CancelDone:
			if status != task.Cancelled || effects != 0 {
				t.Errorf("task %s cancelled while waiting is %s with %d effects, want CANCELLED and none", id, status, effects)
			}
		case task.CancelRequested:
			requested++
			if status != task.Cancelled {
				t.Errorf("task %s whose running handler was cancelled is %s, want CANCELLED:\n%s", id, status, c.story(id.String()))
			}
		default:
			t.Errorf("cancel of task %s: %s (it had not finished)", id, o)
		}
	}
	if requested == 0 {
		t.Errorf("no cancel caught a running task: the running-cancel path was not tested")
	}

	// Periodic: one task per slot, gaps no longer than a failover, no burst.
	var slots, created []time.Time
	rows, err = c.db.Pool.Query(ctx, `SELECT idempotency_key, created_at FROM ingest_task WHERE kind = 'tick' ORDER BY created_at`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key string
		var at time.Time
		if err := rows.Scan(&key, &at); err != nil {
			t.Fatal(err)
		}
		s, err := time.Parse(time.RFC3339, strings.TrimPrefix(key, "periodic:tick:"))
		if err != nil {
			t.Fatalf("tick task key %q: %v", key, err)
		}
		slots, created = append(slots, s), append(created, at)
	}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	if len(slots) < seconds/2 {
		t.Errorf("%d periodic tasks in a %s run with a slot every second", len(slots), span)
	}
	// A killed leader's lease (3 s) runs out, a follower retries within
	// 500 ms, and the slot check runs every 100 ms: no slot gap beyond 5 s.
	const maxGap = 5 * time.Second
	longest := time.Duration(0)
	for i := 1; i < len(slots); i++ {
		if slots[i].Equal(slots[i-1]) {
			t.Errorf("two periodic tasks for the slot %s", slots[i])
		}
		longest = max(longest, slots[i].Sub(slots[i-1]))
	}
	if longest > maxGap {
		timingBound(t, "a gap of %s between periodic slots, longer than a failover (%s)", longest, maxGap)
	}
	for i := 2; i < len(created); i++ {
		if d := created[i].Sub(created[i-2]); d < 900*time.Millisecond {
			t.Errorf("a burst: 3 periodic tasks created within %s (at %s)", d, created[i].Format(time.RFC3339Nano))
		}
	}
	// Concurrency limit: no moment with more than capN runs of capped (a
	// run of a killed worker ended when the worker was gone).
	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	rows, err = c.db.Pool.Query(ctx, `SELECT worker, started_at, ended_at FROM chaos_run r JOIN ingest_task t ON t.id = r.task_id WHERE t.kind = 'capped'`)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	killedAt := maps.Clone(c.killedAt)
	c.mu.Unlock()
	for rows.Next() {
		var worker string
		var began time.Time
		var ended *time.Time
		if err := rows.Scan(&worker, &began, &ended); err != nil {
			t.Fatal(err)
		}
		end, killed := killedAt[worker]
		if ended != nil {
			end = *ended
		} else if !killed {
			t.Errorf("a run of capped on %s started at %s has no end and its worker was not killed", worker, began.Format(time.RFC3339Nano))
			continue
		}
		events = append(events, event{began, 1}, event{end, -1})
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // an end before a start at the same time
	})
	inCap, maxCap := 0, 0
	for _, e := range events {
		inCap += e.delta
		maxCap = max(maxCap, inCap)
	}
	if maxCap > capN {
		t.Errorf("%d runs of capped at once, its concurrency limit is %d", maxCap, capN)
	}
	// Rate limit: no second with more than 10 starts of rated (the starts
	// as audited, the times the limit counts).
	var starts []time.Time
	rows, err = c.db.Pool.Query(ctx, `SELECT tr.created_at FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
		WHERE t.kind = 'rated' AND tr.to_status = 'RUNNING' ORDER BY tr.created_at`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		starts = append(starts, at)
	}
	mostRated := 0
	for i, j := 0, 0; i < len(starts); i++ {
		for j < len(starts) && starts[j].Sub(starts[i]) < rate.Per {
			j++
		}
		mostRated = max(mostRated, j-i)
	}
	if mostRated > rate.Count {
		t.Errorf("%d starts of rated within one second, its rate limit is %d/s", mostRated, rate.Count)
	}
	note := fmt.Sprintf("%d delayed, %d early; %d cancels (%d of running tasks); %d periodic slots, longest gap %s; %d tasks of a paused kind, %d run before its resume; %d tasks limited to 3 running, at most %d at once; %d tasks limited to 10/s, at most %d starts in a second; %s",
		nDelayed, early, len(outcomes), requested, len(slots), longest, len(held), heldEarly, nCapped, maxCap, nRated, mostRated, groups.check())
	amendRow(r.Scenario, note, t.Failed())
	c.t.Logf("scenario 9: %s", note)
}
