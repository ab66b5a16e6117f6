//go:build reliability

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// groupLoad is scenario 9's grouped tasks: a kind ("grouped") limited per
// group to groupCap running tasks and groupRate starts, with a small group
// window, whose tasks are spread over quiet groups created a few at a
// time while workers are killed, one burst group created at once, and one
// group of delayed tasks all due at one moment, which the relays hold to
// the group's window when they fall due.
type groupLoad struct {
	t          *testing.T
	c          *cluster
	quiet      []string // the quiet groups
	each       int      // tasks per quiet group
	perRound   int      // tasks per quiet group created in each round
	created    map[string]int
	burst      int // tasks of the burst group
	scheduled  int // delayed tasks of the scheduled group
	cap        int
	rate       task.Rate
	window     int
	createdAll time.Time // when the last quiet task was created
}

const (
	burstGroup     = "burst"
	scheduledGroup = "scheduled"
)

// newGroupLoad sets the grouped kind's limits. Call it before the
// workers start: a worker reads the kinds' settings at most every second,
// so a limit set after its first read takes effect in it only within
// about a second, and a burst created meanwhile would start unlimited
// (as documented; this scenario checks the limits, not that delay).
func newGroupLoad(t *testing.T, c *cluster) *groupLoad {
	g := &groupLoad{t: t, c: c, each: size(10, 30), perRound: size(3, 6), burst: size(80, 300), scheduled: size(40, 120),
		cap: 2, rate: task.Rate{Count: 5, Per: time.Second}, window: 4, created: map[string]int{}}
	for i := range size(4, 9) {
		g.quiet = append(g.quiet, fmt.Sprintf("tenant-%d", i))
	}
	ctx := context.Background()
	if _, err := c.store.SetKind(ctx, "chaos", "grouped", task.KindUpdate{
		ConcurrencyPerGroup: &g.cap, RatePerGroup: &g.rate, GroupWindow: &g.window}); err != nil {
		t.Fatal(err)
	}
	return g
}

// createBurst creates the burst group's tasks at once, and the scheduled
// group's, due together two seconds later.
func (g *groupLoad) createBurst() {
	g.create(burstGroup, g.burst, 0)
	g.create(scheduledGroup, g.scheduled, 2*time.Second)
}

// create creates n tasks of group, each running 100 ms (so that the
// concurrency limit binds while a killed worker's runs are taken over),
// due after delay.
func (g *groupLoad) create(group string, n int, delay time.Duration) {
	g.t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "grouped", Payload: json.RawMessage(`{"ms":100}`), MaxAttempts: 50, GroupKey: group, Delay: delay}
	}
	if _, err := g.c.store.CreateBatch(context.Background(), nts); err != nil {
		g.t.Fatal(err)
	}
	g.created[group] += n
}

// round creates the next few tasks of every quiet group (one call per
// kill of the scenario's loop); done reports whether all are created.
// The scenario calls it until done before its workers stop.
func (g *groupLoad) round() (done bool) {
	for _, q := range g.quiet {
		if n := min(g.perRound, g.each-g.created[q]); n > 0 {
			g.create(q, n, 0)
		}
	}
	done = g.created[g.quiet[0]] >= g.each
	if done && g.createdAll.IsZero() {
		g.createdAll = time.Now()
	}
	return done
}

// check runs once the system is quiet: every grouped task SUCCEEDED; no
// group ever had more than cap handler runs at once (a killed worker's
// open runs end at its kill) nor more than rate's count of starts (the
// audited RUNNING transitions, the times the limit counts) in any window
// of its period; and the burst did not starve the quiet groups: each of
// their tasks started before the burst group's last start. It returns the
// figures for the scenario's row.
func (g *groupLoad) check() string {
	t, c, ctx := g.t, g.c, context.Background()
	total := g.burst + g.scheduled + g.each*len(g.quiet)
	var succeeded int
	if err := c.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'SUCCEEDED') FROM ingest_task WHERE kind = 'grouped'`).Scan(&succeeded); err != nil {
		t.Fatal(err)
	}
	if succeeded != total {
		t.Errorf("%d of %d grouped tasks SUCCEEDED", succeeded, total)
	}

	// Concurrency per group, from the handler runs.
	type event struct {
		at    time.Time
		delta int
	}
	events := map[string][]event{}
	rows, err := c.db.Pool.Query(ctx, `SELECT t.group_key, r.worker, r.started_at, r.ended_at
		FROM chaos_run r JOIN ingest_task t ON t.id = r.task_id WHERE t.kind = 'grouped'`)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	killedAt := maps.Clone(c.killedAt)
	c.mu.Unlock()
	for rows.Next() {
		var group, worker string
		var began time.Time
		var ended *time.Time
		if err := rows.Scan(&group, &worker, &began, &ended); err != nil {
			t.Fatal(err)
		}
		end, killed := killedAt[worker]
		if ended != nil {
			end = *ended
		} else if !killed {
			t.Errorf("a run of group %s on %s started at %s has no end and its worker was not killed", group, worker, began.Format(time.RFC3339Nano))
			continue
		}
		events[group] = append(events[group], event{began, 1}, event{end, -1})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(events) != len(g.quiet)+2 {
		t.Errorf("handler runs of %d groups, want %d", len(events), len(g.quiet)+2)
	}
	maxCap := 0
	for group, evs := range events {
		slices.SortFunc(evs, func(a, b event) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return a.delta - b.delta // an end before a start at the same time
		})
		in, most := 0, 0
		for _, e := range evs {
			in += e.delta
			most = max(most, in)
		}
		if most > g.cap {
			t.Errorf("group %s: %d runs at once, its concurrency per group is %d", group, most, g.cap)
		}
		maxCap = max(maxCap, most)
	}

	// Rate per group, from the audited starts.
	starts := map[string][]time.Time{}
	rows, err = c.db.Pool.Query(ctx, `SELECT t.group_key, tr.created_at FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
		WHERE t.kind = 'grouped' AND tr.to_status = 'RUNNING' ORDER BY tr.created_at`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var group string
		var at time.Time
		if err := rows.Scan(&group, &at); err != nil {
			t.Fatal(err)
		}
		starts[group] = append(starts[group], at)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	mostRated := 0
	for group, s := range starts {
		most := 0
		for i, j := 0, 0; i < len(s); i++ {
			for j < len(s) && s[j].Sub(s[i]) < g.rate.Per {
				j++
			}
			most = max(most, j-i)
		}
		if most > g.rate.Count {
			t.Errorf("group %s: %d starts within %s, its rate per group is %s", group, most, g.rate.Per, g.rate)
		}
		mostRated = max(mostRated, most)
	}

	// No starvation: every quiet task started before the burst's last
	// start (its first start: a takeover is a later start of the same
	// task, not a wait).
	var burstLast, quietLast time.Time
	if err := c.db.Pool.QueryRow(ctx, `WITH first AS (
		SELECT t.group_key AS g, min(tr.created_at) AS at FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
		WHERE t.kind = 'grouped' AND tr.to_status = 'RUNNING' GROUP BY t.id, t.group_key)
		SELECT coalesce(max(at) FILTER (WHERE g = $1), 'epoch'), coalesce(max(at) FILTER (WHERE g NOT IN ($1, $2)), 'epoch') FROM first`,
		burstGroup, scheduledGroup).Scan(&burstLast, &quietLast); err != nil {
		t.Fatal(err)
	}
	if !quietLast.Before(burstLast) {
		t.Errorf("a quiet group's task first started at %s, not before the burst group's last task (%s)",
			quietLast.Format(time.RFC3339Nano), burstLast.Format(time.RFC3339Nano))
	}
	// The quiet tasks' waits, from create to first start (a figure, not
	// a bound: the machine's load sets it).
	var p50, p95, most float64
	if err := c.db.Pool.QueryRow(ctx, `WITH w AS (
		SELECT extract(epoch FROM min(tr.created_at) - t.created_at) AS s FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
		WHERE t.kind = 'grouped' AND t.group_key NOT IN ($1, $2) AND tr.to_status = 'RUNNING' GROUP BY t.id, t.created_at)
		SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY s), 0), coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY s), 0), coalesce(max(s), 0) FROM w`,
		burstGroup, scheduledGroup).Scan(&p50, &p95, &most); err != nil {
		t.Fatal(err)
	}
	// The long waits, and how many of them had a worker killed between
	// their create and their start (a task a killed worker had read but
	// not started waits for the reclaim).
	long, killedBetween := 0, 0
	rows, err = c.db.Pool.Query(ctx, `SELECT t.created_at, min(tr.created_at) FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
		WHERE t.kind = 'grouped' AND t.group_key NOT IN ($1, $2) AND tr.to_status = 'RUNNING' GROUP BY t.id, t.created_at
		HAVING min(tr.created_at) - t.created_at > interval '1 second'`, burstGroup, scheduledGroup)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var made, began time.Time
		if err := rows.Scan(&made, &began); err != nil {
			t.Fatal(err)
		}
		long++
		for _, k := range killedAt {
			if k.After(made) && k.Before(began) {
				killedBetween++
				break
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// A baseline of the same period: the ungrouped tasks (kind ok) that
	// became due while the quiet tasks were created, from due to first
	// start. The quiet groups waiting as long as these is the workers'
	// shared capacity, not the burst.
	var b50, b95 float64
	if err := c.db.Pool.QueryRow(ctx, `WITH q AS (
		SELECT min(created_at) AS lo, max(created_at) AS hi FROM ingest_task WHERE kind = 'grouped' AND group_key NOT IN ($1, $2)),
		w AS (SELECT extract(epoch FROM min(tr.created_at) - greatest(t.created_at, coalesce(t.due_at, t.created_at))) AS s
		FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id, q
		WHERE t.kind = 'ok' AND tr.to_status = 'RUNNING'
		  AND greatest(t.created_at, coalesce(t.due_at, t.created_at)) BETWEEN q.lo AND q.hi GROUP BY t.id)
		SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY s), 0), coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY s), 0) FROM w`,
		burstGroup, scheduledGroup).Scan(&b50, &b95); err != nil {
		t.Fatal(err)
	}
	secs := func(f float64) time.Duration {
		return time.Duration(f * float64(time.Second)).Round(10 * time.Millisecond)
	}
	return fmt.Sprintf("%d grouped tasks (a burst of %d, %d of one group delayed to one moment, %d quiet groups × %d created during the kills), %d SUCCEEDED, limited per group to %d running and %s: at most %d at once and %d starts in %s; the quiet groups' last start %s before the burst's last, their create-to-start p50 %s p95 %s max %s (%d waited over 1 s, %d of them across a kill; ungrouped tasks due in the same period: p50 %s p95 %s)",
		total, g.burst, g.scheduled, len(g.quiet), g.each, succeeded, g.cap, g.rate, maxCap, mostRated, g.rate.Per, burstLast.Sub(quietLast).Round(100*time.Millisecond), secs(p50), secs(p95), secs(most), long, killedBetween, secs(b50), secs(b95))
}
