package ingest_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// TestKindLimitsAcrossWorkers: two workers share a kind limited to 3
// running tasks, a kind limited to 6 starts per second and an unlimited
// kind. The cap is never exceeded (handler overlaps measured) and is used,
// no one-second window holds more than 6 starts of the rated kind, the
// unlimited kind's tasks all finish while the limited kinds still wait,
// and no waiting task counts a failed attempt.
func TestKindLimitsAcrossWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	capN, rate := 3, task.Rate{Count: 6, Per: time.Second}
	if _, err := b.store.SetKind(ctx, "test", "capped", task.KindUpdate{Concurrency: &capN}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SetKind(ctx, "test", "rated", task.KindUpdate{Rate: &rate}); err != nil {
		t.Fatal(err)
	}
	const runFor = 40 * time.Millisecond
	var (
		mu              sync.Mutex
		inCap, maxInCap int
		busy            time.Duration // summed handler time of capped
		firstCap        time.Time
		lastCap         time.Time
		freeDoneAt      atomic.Int64
		freeRuns        atomic.Int64
	)
	capped := func(context.Context, ingest.Task) error {
		mu.Lock()
		inCap++
		maxInCap = max(maxInCap, inCap)
		began := time.Now()
		if firstCap.IsZero() {
			firstCap = began
		}
		mu.Unlock()
		time.Sleep(runFor) // the work
		mu.Lock()
		inCap--
		busy += time.Since(began)
		lastCap = time.Now()
		mu.Unlock()
		return nil
	}
	handlers := map[string]ingest.Handler{
		"capped": capped,
		"rated":  func(context.Context, ingest.Task) error { return nil },
		"free": func(context.Context, ingest.Task) error {
			if freeRuns.Add(1) == 300 {
				freeDoneAt.Store(time.Now().UnixNano())
			}
			return nil
		},
	}
	for _, name := range []string{"w1", "w2"} {
		b.run(b.limitConfig(name), handlers, slog.LevelError)
	}
	b.createKind("capped", 90)
	b.createKind("rated", 60)
	b.createKind("free", 300)
	count := b.query
	b.eventually(60*time.Second, "every task SUCCEEDED", func() bool {
		return count(`SELECT count(*) FROM ingest_task WHERE status = 'SUCCEEDED'`) == 450
	})

	mu.Lock()
	defer mu.Unlock()
	if maxInCap > capN {
		t.Errorf("%d capped tasks ran at once, the limit is %d", maxInCap, capN)
	}
	// Used: on average the cap's slots were busy most of the time.
	used := busy.Seconds() / lastCap.Sub(firstCap).Seconds() / float64(capN)
	t.Logf("concurrency limit %d: at most %d at once, slots busy %.0f%% of the time", capN, maxInCap, 100*used)
	if maxInCap < capN {
		t.Errorf("at most %d capped tasks ran at once: the limit %d was never reached", maxInCap, capN)
	}

	// Rate: no window of one second holds more than 6 starts.
	rows, err := b.db.Pool.Query(ctx, `SELECT tr.created_at FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
		WHERE t.kind = 'rated' AND tr.to_status = 'RUNNING' ORDER BY tr.created_at`)
	if err != nil {
		t.Fatal(err)
	}
	var starts []time.Time
	for rows.Next() {
		var at time.Time
		if err := rows.Scan(&at); err != nil {
			t.Fatal(err)
		}
		starts = append(starts, at)
	}
	most := 0
	for i := range starts {
		j := i
		for j < len(starts) && starts[j].Sub(starts[i]) < time.Second {
			j++
		}
		most = max(most, j-i)
	}
	span := starts[len(starts)-1].Sub(starts[0])
	t.Logf("rate limit 6/s: %d starts over %s (%.1f/s), at most %d in a one-second window", len(starts), span, float64(len(starts)-1)/span.Seconds(), most)
	if most > rate.Count {
		t.Errorf("%d starts of the rated kind within one second, the limit is %d", most, rate.Count)
	}
	if len(starts) != 60 {
		t.Errorf("%d starts of 60 rated tasks", len(starts))
	}
	// 60 starts at 6/s take at least nine seconds: the unlimited kind's
	// 300 tasks finished long before, even on a slow machine.
	if done := time.Unix(0, freeDoneAt.Load()); !done.Before(starts[len(starts)-1]) {
		t.Errorf("the unlimited kind finished at %s, after the rated kind's last start %s", done, starts[len(starts)-1])
	}
	if n := count(`SELECT count(*) FROM ingest_task_transition WHERE to_status = 'RETRYING'`); n != 0 {
		var why []string
		if err := b.db.Pool.QueryRow(ctx, `SELECT array_agg(DISTINCT coalesce(message, '')) FROM ingest_task_transition WHERE to_status = 'RETRYING'`).Scan(&why); err != nil {
			t.Fatal(err)
		}
		t.Errorf("%d failed attempts (%q)", n, why)
	}
}
