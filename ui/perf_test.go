package ui

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// TestOverviewPerformance loads INGEST_UI_PERF_ROWS tasks (1000000 for the
// figure in docs/PERFORMANCE.md) with an outbox row and a creation audit row each,
// the last 30,000 of them with a full audit trail within the charts'
// window, then times the overview (uncached: every query, the audit
// samples and the rendering) and logs the EXPLAIN ANALYZE of its queries.
//
//	INGEST_UI_PERF_ROWS=1000000 go test -count=1 -run TestOverviewPerformance -v ./ui/
func TestOverviewPerformance(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("INGEST_UI_PERF_ROWS"))
	if n <= 0 {
		t.Skip("set INGEST_UI_PERF_ROWS=1000000 to load that many tasks and time the overview")
	}
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	pool := db.Pool
	begun := time.Now()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", strings.Fields(sql)[0:3], err)
		}
	}
	// Statuses per 1000 tasks: 950 SUCCEEDED, 30 DEAD, 10 QUEUED,
	// 5 RETRYING, 3 RUNNING, 2 CANCELLED; 20 kinds; created over 30 days,
	// the newest 30,000 in the last 14 minutes.
	exec(`
INSERT INTO ingest_task (id, kind, payload, payload_sha, status, attempt_count, created_at, updated_at, finished_at,
                         last_error, lease_owner, lease_until, next_retry_at, cancel_requested_at)
SELECT gen_random_uuid(), 'kind-' || (i % 20), jsonb_build_object('n', i), md5(i::text), s, CASE WHEN s = 'DEAD' THEN 3 ELSE 0 END,
       c, c + interval '1 second', CASE WHEN s IN ('SUCCEEDED', 'DEAD', 'CANCELLED') THEN c + interval '1 second' END,
       CASE WHEN s IN ('DEAD', 'RETRYING') THEN 'upstream 503' END,
       CASE WHEN s = 'RUNNING' THEN 'worker-1' END, CASE WHEN s = 'RUNNING' THEN now() + interval '30 seconds' END,
       CASE WHEN s = 'RETRYING' THEN now() + interval '1 minute' END,
       CASE WHEN s = 'CANCELLED' THEN c END
FROM (SELECT i,
             CASE WHEN i % 1000 < 950 THEN 'SUCCEEDED' WHEN i % 1000 < 980 THEN 'DEAD' WHEN i % 1000 < 990 THEN 'QUEUED'
                  WHEN i % 1000 < 995 THEN 'RETRYING' WHEN i % 1000 < 998 THEN 'RUNNING' ELSE 'CANCELLED' END AS s,
             CASE WHEN i > $1 - 30000 THEN now() - ($1 - i)::float8 / 30000 * interval '14 minutes'
                  ELSE now() - interval '15 minutes' - ($1 - i)::float8 / $1 * interval '30 days' END AS c
      FROM generate_series(1, $1) AS i) x`, n)
	exec(`
INSERT INTO outbox_event (task_id, stream, status, attempt_count, stream_id, created_at, sent_at, next_retry_at)
SELECT id, 'ingest:tasks', CASE WHEN status = 'QUEUED' THEN 'NEW' ELSE 'SENT' END, 1,
       CASE WHEN status = 'QUEUED' THEN NULL ELSE '1-1' END, created_at,
       CASE WHEN status = 'QUEUED' THEN NULL ELSE created_at END, created_at
FROM ingest_task`)
	exec(`
INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, worker, message, created_at)
SELECT id, NULL, 'QUEUED', 0, 'api', 'created', created_at FROM ingest_task ORDER BY created_at`)
	exec(`
INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, worker, created_at)
SELECT id, 'QUEUED', 'RUNNING', 0, 'worker-1', created_at + interval '400 milliseconds' FROM ingest_task
WHERE created_at > now() - interval '15 minutes' AND status <> 'QUEUED'
UNION ALL
SELECT id, 'RUNNING', status, attempt_count, 'worker-1', finished_at FROM ingest_task
WHERE created_at > now() - interval '15 minutes' AND status IN ('SUCCEEDED', 'DEAD')`)
	exec(`VACUUM ANALYZE ingest_task`)
	exec(`VACUUM ANALYZE outbox_row`)
	exec(`VACUUM ANALYZE ingest_task_transition`)
	var tasks, transitions int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ingest_task), (SELECT count(*) FROM ingest_task_transition)`).Scan(&tasks, &transitions); err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d tasks, %d outbox rows, %d audit rows in %s", tasks, tasks, transitions, time.Since(begun).Round(time.Second))

	store, err := task.NewStore(task.Config{}, pool)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Store: store, DB: pool, Redis: testenv.Redis(t), Stream: "perf:{p}:tasks", Group: "ingest-workers", DLQKey: "perf:{p}:tasks:dlq"})
	if err != nil {
		t.Fatal(err)
	}
	// The first overview starts the audit sampler (it reads the window
	// once); later ones read what was written since.
	timeIt := func() time.Duration {
		h.stats.forget()
		begun := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/?live=1", nil))
		if rec.Code != 200 {
			t.Fatalf("overview: %d %s", rec.Code, rec.Body.String())
		}
		return time.Since(begun)
	}
	first := timeIt()
	var runs []time.Duration
	for range 15 {
		time.Sleep(sampleEvery) // each run refreshes the samples too
		runs = append(runs, timeIt())
	}
	slices.Sort(runs)
	median := runs[len(runs)/2]
	t.Logf("overview with %d tasks: first (sampler start) %s; then min %s, median %s, max %s over %d runs",
		tasks, first.Round(time.Millisecond), runs[0].Round(time.Millisecond), median.Round(time.Millisecond),
		runs[len(runs)-1].Round(time.Millisecond), len(runs))
	d := h.stats.last
	t.Logf("statuses: %+v", d.Statuses)

	// The audit reads (package task) are timed rather than explained.
	t0 := time.Now()
	start, err := task.AuditWindowStart(ctx, pool, Window)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sampler start: %s", time.Since(t0).Round(time.Microsecond))
	for _, r := range []struct {
		name  string
		after int64
		since time.Time
	}{
		{"audit samples, the first read", start, time.Now().Add(-Window)},
		{"audit samples, a later read", h.samp.lastID, h.samp.lastAt.Add(-sampleSlack)},
	} {
		t0 := time.Now()
		if _, err := task.AuditSamples(ctx, pool, r.after, r.since, sampleBatch, Bucket); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", r.name, time.Since(t0).Round(time.Microsecond))
	}
	t0 = time.Now()
	if _, err := outbox.ReadBacklog(ctx, pool, CountCap+1); err != nil {
		t.Fatal(err)
	}
	t.Logf("outbox backlog: %s", time.Since(t0).Round(time.Microsecond))
	for _, q := range []struct {
		name string
		sql  string
		args []any
	}{
		{"estimates", estimateSQL, nil},
		{"leader", leaderSQL, nil},
		{"kind settings", kindSettingsSQL, nil},
	} {
		rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+q.sql, q.args...)
		if err != nil {
			t.Fatalf("explain %s: %v", q.name, err)
		}
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		rows.Close()
		t.Logf("EXPLAIN %s:\n%s", q.name, strings.Join(plan, "\n"))
	}
	if median > 100*time.Millisecond {
		t.Errorf("the overview's median is %s with %d tasks, want under 100ms", median, tasks)
	}
}
