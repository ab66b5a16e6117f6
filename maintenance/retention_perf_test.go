package maintenance_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// TestRetentionPassBesideAWorker loads INGEST_RETENTION_PERF_ROWS expired
// SUCCEEDED tasks (100000 for the figure in docs/PERFORMANCE.md), each
// with an audit row and an outbox row, and runs a worker's cycle (create,
// start, succeed, four at a time) alone and then during a retention pass
// that deletes them all. It logs the pass's rate and the worker's
// throughput both ways, and fails if the worker lost more than 20%. A
// timing bound, so not a CI test: run it on an otherwise idle machine.
//
//	INGEST_RETENTION_PERF_ROWS=100000 go test -count=1 -run TestRetentionPassBesideAWorker -v ./maintenance/
func TestRetentionPassBesideAWorker(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("INGEST_RETENTION_PERF_ROWS"))
	if n <= 0 {
		t.Skip("set INGEST_RETENTION_PERF_ROWS=100000 to time a retention pass beside a worker")
	}
	ctx := context.Background()
	b := setup(t)
	for i, q := range []string{
		// Ids: UUIDv7-ordered, created two days ago; finished a day and a
		// half ago.
		`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, status, attempt_count, finished_at)
		 SELECT (lpad(to_hex((extract(epoch FROM now() - interval '2 days') * 1000)::bigint + g), 12, '0') || substr(md5(g::text), 1, 20))::uuid,
		        'old', '{"n":1}', md5(g::text), 3, 'SUCCEEDED', 1, now() - interval '36 hours'
		 FROM generate_series(1, $1) g`,
		`INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count) SELECT id, NULL, 'QUEUED', 0 FROM ingest_task WHERE kind = 'old'`,
		`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at) SELECT id, 's', 'SENT', '1-1', now() - interval '2 days' FROM ingest_task WHERE kind = 'old'`,
		`VACUUM ANALYZE ingest_task`, `VACUUM ANALYZE ingest_task_transition`, `VACUUM ANALYZE outbox_row`,
	} {
		var args []any
		if i == 0 {
			args = []any{n} // the tasks
		}
		if _, err := b.db.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	// work runs the worker's cycle until stop is closed and returns its
	// rate in tasks/s.
	work := func(stop <-chan struct{}) float64 {
		var done atomic.Int64
		var wg sync.WaitGroup
		begun := time.Now()
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				owner := "w" + strconv.Itoa(w)
				for {
					select {
					case <-stop:
						return
					default:
					}
					r, err := b.store.Create(ctx, task.NewTask{Kind: "live", Payload: json.RawMessage(`{"n":1}`)})
					if err == nil {
						_, err = b.store.Start(ctx, owner, time.Minute, r.Task.ID)
					}
					if err == nil {
						_, err = b.store.Succeed(ctx, owner, r.Task.ID)
					}
					if err != nil {
						t.Error(err)
						return
					}
					done.Add(1)
				}
			}()
		}
		<-stop
		wg.Wait()
		return float64(done.Load()) / time.Since(begun).Seconds()
	}

	r := b.retention(t, maintenance.RetentionConfig{DisableTrim: true})
	// The worker alone for 5 s before the pass and 5 s after it, to even
	// out a drift of the machine.
	workAlone := func() float64 {
		stop := make(chan struct{})
		time.AfterFunc(5*time.Second, func() { close(stop) })
		return work(stop)
	}
	before := workAlone()
	stop := make(chan struct{})
	rate := make(chan float64)
	go func() { rate <- work(stop) }()
	begun := time.Now()
	res, err := r.RunOnce(ctx)
	took := time.Since(begun)
	close(stop)
	beside := <-rate
	alone := (before + workAlone()) / 2
	if err != nil {
		t.Fatal(err)
	}
	if res.Tasks[task.Succeeded] != n {
		t.Fatalf("the pass deleted %d tasks, want %d", res.Tasks[task.Succeeded], n)
	}
	t.Logf("retention pass: %d tasks (with %d audit and %d outbox rows) in %s: %.0f tasks/s", n, n, n, took.Round(time.Millisecond), float64(n)/took.Seconds())
	t.Logf("worker (4 goroutines: create, start, succeed): %.0f tasks/s alone, %.0f tasks/s during the pass (%.0f%%)", alone, beside, 100*beside/alone)
	if beside < 0.8*alone {
		t.Errorf("the worker lost more than 20%% of its throughput during the pass")
	}
}
