package ingest_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// TestGroupLimitsAcrossWorkers: three workers share a kind limited to 2
// running tasks per group and 5 in all, and a kind limited to 10 starts
// per second per group. Measured from the audit trail (each run's
// interval from its RUNNING row to the row that ended it), no group ever
// has more than 2 runs at once nor the kind more than 5, no group more
// than 10 starts in a one-second window; both limits are reached, and no
// waiting task counts a failed attempt.
func TestGroupLimitsAcrossWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	perGroup, kindCap := 2, 5
	rate := task.Rate{Count: 10, Per: time.Second}
	if _, err := b.store.SetKind(ctx, "test", "tenant", task.KindUpdate{ConcurrencyPerGroup: &perGroup, Concurrency: &kindCap}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SetKind(ctx, "test", "grate", task.KindUpdate{RatePerGroup: &rate}); err != nil {
		t.Fatal(err)
	}
	handlers := map[string]ingest.Handler{
		"tenant": func(context.Context, ingest.Task) error { time.Sleep(20 * time.Millisecond); return nil }, // the work
		"grate":  func(context.Context, ingest.Task) error { return nil },
	}
	for _, name := range []string{"w1", "w2", "w3"} {
		b.run(b.limitConfig(name), handlers, slog.LevelError)
	}
	var nts []task.NewTask
	for _, g := range []string{"a", "b", "c", ""} {
		for range 25 {
			nts = append(nts, task.NewTask{Kind: "tenant", GroupKey: g, Payload: json.RawMessage(`{}`)})
		}
	}
	for _, g := range []string{"x", "y", ""} {
		for range 25 {
			nts = append(nts, task.NewTask{Kind: "grate", GroupKey: g, Payload: json.RawMessage(`{}`)})
		}
	}
	if _, err := b.store.CreateBatch(ctx, nts); err != nil {
		t.Fatal(err)
	}
	b.eventually(120*time.Second, "every task SUCCEEDED", func() bool {
		return b.query(`SELECT count(*) FROM ingest_task WHERE status = 'SUCCEEDED'`) == len(nts)
	})

	type run struct {
		group      string
		start, end time.Time
	}
	runs := func(kind string) []run {
		rows, err := b.db.Pool.Query(ctx, `
SELECT coalesce(t.group_key, ''), tr.created_at,
       (SELECT min(e.created_at) FROM ingest_task_transition e WHERE e.task_id = tr.task_id AND e.id > tr.id)
FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
WHERE t.kind = $1 AND tr.to_status = 'RUNNING'`, kind)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []run
		for rows.Next() {
			var r run
			if err := rows.Scan(&r.group, &r.start, &r.end); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// mostAtOnce is the largest number of runs whose intervals overlap.
	mostAtOnce := func(rs []run) int {
		type edge struct {
			at time.Time
			d  int
		}
		var es []edge
		for _, r := range rs {
			es = append(es, edge{r.start, 1}, edge{r.end, -1})
		}
		sort.Slice(es, func(i, j int) bool {
			if es[i].at.Equal(es[j].at) {
				return es[i].d < es[j].d // an end before a start at the same time
			}
			return es[i].at.Before(es[j].at)
		})
		n, most := 0, 0
		for _, e := range es {
			n += e.d
			most = max(most, n)
		}
		return most
	}
	byGroup := func(rs []run) map[string][]run {
		m := map[string][]run{}
		for _, r := range rs {
			m[r.group] = append(m[r.group], r)
		}
		return m
	}

	tenant := runs("tenant")
	if len(tenant) != 100 {
		t.Errorf("%d runs of 100 tenant tasks", len(tenant))
	}
	reached := false
	for g, rs := range byGroup(tenant) {
		most := mostAtOnce(rs)
		t.Logf("group %q: %d runs, at most %d at once", g, len(rs), most)
		if most > perGroup {
			t.Errorf("group %q had %d runs at once, the per-group limit is %d", g, most, perGroup)
		}
		reached = reached || most == perGroup
	}
	if !reached {
		t.Errorf("no group reached its limit of %d runs at once", perGroup)
	}
	if most := mostAtOnce(tenant); most > kindCap {
		t.Errorf("the kind had %d runs at once, its limit is %d", most, kindCap)
	} else {
		t.Logf("kind: at most %d runs at once (limit %d)", most, kindCap)
	}

	for g, rs := range byGroup(runs("grate")) {
		var starts []time.Time
		for _, r := range rs {
			starts = append(starts, r.start)
		}
		sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
		most := 0
		for i := range starts {
			j := i
			for j < len(starts) && starts[j].Sub(starts[i]) < time.Second {
				j++
			}
			most = max(most, j-i)
		}
		t.Logf("group %q: %d starts, at most %d in a one-second window", g, len(starts), most)
		if most > rate.Count {
			t.Errorf("group %q: %d starts within one second, the per-group limit is %d", g, most, rate.Count)
		}
		if len(starts) != 25 {
			t.Errorf("group %q: %d starts of 25", g, len(starts))
		}
	}
	if n := b.query(`SELECT count(*) FROM ingest_task_transition WHERE to_status = 'RETRYING'`); n != 0 {
		var why []string
		if err := b.db.Pool.QueryRow(ctx, `SELECT array_agg(DISTINCT t.kind || ': ' || coalesce(tr.message, '')) FROM ingest_task_transition tr
			JOIN ingest_task t ON t.id = tr.task_id WHERE tr.to_status = 'RETRYING'`).Scan(&why); err != nil {
			t.Fatal(err)
		}
		t.Errorf("%d failed attempts (%q)", n, why)
	}
}
