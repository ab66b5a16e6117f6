package bench_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/bench"
	"github.com/ingest-worker/ingest/internal/testenv"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(scaleChildEnv); spec != "" {
		os.Exit(runScaleChild(spec)) // a worker process of BenchmarkScaleProcesses
	}
	testenv.Main(m)
}

// TestRunSmoke runs the full path with 2,000 tasks in both modes: every
// task ends SUCCEEDED (Run verifies it in SQL) and the report is complete.
// Numbers are not asserted.
func TestRunSmoke(t *testing.T) {
	t.Parallel()
	for _, preload := range []bool{false, true} {
		name := "Continuous"
		if preload {
			name = "Preload"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDatabase(t)
			rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
			var progress bytes.Buffer
			rep, err := bench.Run(context.Background(), bench.Options{Tasks: 2000, Preload: preload, Concurrency: 200}, db.Pool, rdb, &progress)
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, progress.String())
			}
			if rep.Succeeded != 2000 || rep.TasksPerSecond <= 0 || rep.InsertPerSecond <= 0 {
				t.Errorf("report %+v", rep)
			}
			if rep.LatencyMS.Start.Count != 2000 || rep.LatencyMS.Done.Count != 2000 {
				t.Errorf("latency samples: start %d, done %d, want 2000 each", rep.LatencyMS.Start.Count, rep.LatencyMS.Done.Count)
			}
			if rep.SQLStatements == 0 || rep.RedisRoundTrips == 0 || rep.PeakRSSMiB <= 0 {
				t.Errorf("counters not collected: %+v", rep)
			}
			if m := rep.MemoryAtPeak; m.RSSMiB <= 0 || m.RSSMiB > rep.PeakRSSMiB || m.StacksMiB <= 0 || m.Goroutines == 0 ||
				m.HeapLiveMiB <= 0 || m.RuntimeMiB <= m.StacksMiB {
				t.Errorf("memory at the peak %+v (peak RSS %.1f MiB)", m, rep.PeakRSSMiB)
			}
			var out bytes.Buffer
			bench.Print(&out, rep)
			for _, want := range []string{"tasks/s worked", "commit→SUCCEEDED", "SQL statements/task", "peak RSS", "at the peak"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// TestRunPublishFirst: a preload with PublishFirst publishes every task
// after its commit during the insert phase, so the timed work starts from
// a full stream: each task ends SUCCEEDED with one outbox row, written
// SENT by the relay (never claimed, as a NEW row would have been).
func TestRunPublishFirst(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
	const tasks = 2000
	var progress bytes.Buffer
	rep, err := bench.Run(context.Background(), bench.Options{Tasks: tasks, Preload: true, PublishFirst: true,
		Concurrency: 200, Keep: true}, db.Pool, rdb, &progress)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if rep.Mode != "preload-published" || rep.Succeeded != tasks {
		t.Fatalf("mode %q, %d SUCCEEDED; want preload-published, %d", rep.Mode, rep.Succeeded, tasks)
	}
	var rows, sentUnclaimed, tasksWithOne int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*),
		count(*) FILTER (WHERE status = 'SENT' AND claimed_by IS NULL AND stream_id IS NOT NULL),
		(SELECT count(*) FROM (SELECT task_id FROM outbox_event GROUP BY task_id HAVING count(*) = 1) o)
		FROM outbox_event`).Scan(&rows, &sentUnclaimed, &tasksWithOne); err != nil {
		t.Fatal(err)
	}
	if rows != tasks || sentUnclaimed != tasks || tasksWithOne != tasks {
		t.Errorf("%d outbox rows, %d SENT and never claimed, %d tasks with one row; want %d of each",
			rows, sentUnclaimed, tasksWithOne, tasks)
	}
}

// TestRunFailRateAndPayload runs a preload in which a fifth of the tasks
// fail their first attempt: every task still ends SUCCEEDED, exactly the
// tasks FailsFirstAttempt names failed once, and each payload carries the
// padding string.
func TestRunFailRateAndPayload(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
	const tasks, rate, pad = 1000, 0.2, 300
	var progress bytes.Buffer
	rep, err := bench.Run(context.Background(), bench.Options{Tasks: tasks, Preload: true, Concurrency: 200,
		PayloadBytes: pad, FailRate: rate, Keep: true}, db.Pool, rdb, &progress)
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if rep.Succeeded != tasks || rep.PayloadBytes != pad || rep.FailRate != rate || rep.RetryDelay == "" {
		t.Errorf("report %+v", rep)
	}
	// 200 expected; 100..300 is more than seven standard deviations.
	if rep.FailedAttempts < 100 || rep.FailedAttempts > 300 {
		t.Errorf("%d first attempts failed, want about %d", rep.FailedAttempts, int(tasks*rate))
	}

	rows, err := db.Pool.Query(context.Background(),
		`SELECT id, attempt_count, status, payload->>'pad' FROM ingest_task`)
	if err != nil {
		t.Fatal(err)
	}
	var n, twice int64
	for rows.Next() {
		var id uuid.UUID
		var failures int // attempt_count counts failed runs
		var status, got string
		if err := rows.Scan(&id, &failures, &status, &got); err != nil {
			t.Fatal(err)
		}
		n++
		want := 0
		if bench.FailsFirstAttempt(id[:], rate) {
			want = 1
			twice++
		}
		if failures != want || status != "SUCCEEDED" {
			t.Errorf("task %s: %d failed runs, %s; want %d, SUCCEEDED", id, failures, status, want)
		}
		if got != bench.Pad(pad) {
			t.Errorf("task %s: payload pad of %d bytes, want %d", id, len(got), pad)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != tasks || twice != rep.FailedAttempts {
		t.Errorf("%d tasks, %d chosen to fail; the report says %d failed", n, twice, rep.FailedAttempts)
	}
}

// TestRunWebhook runs a small preload with the webhook handler against
// the sink, a tenth of the tasks failing their first attempt (the sink
// answers 500): every task ends SUCCEEDED, exactly the tasks
// FailsFirstAttempt names failed once, and the sink received one request
// per attempt.
func TestRunWebhook(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
	const tasks, rate = 300, 0.1
	var progress bytes.Buffer
	// The run takes about a second; a retry that does not come back shows
	// in a minute, with the tasks left over, not at the test's deadline.
	rep, err := bench.Run(context.Background(), bench.Options{Tasks: tasks, Preload: true, Concurrency: 100,
		Handler: bench.HandlerWebhook, FailRate: rate, PayloadBytes: 100, Keep: true, Timeout: time.Minute}, db.Pool, rdb, &progress)
	if err != nil {
		var left []string
		rows, qerr := db.Pool.Query(context.Background(),
			`SELECT id::text || ' ' || status || ' after ' || attempt_count || ' failed runs' FROM ingest_task WHERE status <> 'SUCCEEDED'`)
		if qerr == nil {
			left, qerr = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		t.Fatalf("Run: %v\n%s\ntasks not SUCCEEDED: %q (%v)", err, progress.String(), left, qerr)
	}
	if rep.Succeeded != tasks || rep.Handler != "webhook" || rep.HandlerSleep != "none" {
		t.Errorf("report %+v", rep)
	}
	// 30 expected; 0 has a probability of 2e-14.
	if rep.FailedAttempts < 1 || rep.SinkRequests != tasks+rep.FailedAttempts {
		t.Errorf("%d failed attempts, %d sink requests; want some, and %d + failed", rep.FailedAttempts, rep.SinkRequests, tasks)
	}
	if rep.SinkConnections < 1 || rep.SinkConnections > rep.SinkRequests {
		t.Errorf("%d sink connections for %d requests", rep.SinkConnections, rep.SinkRequests)
	}
	if !strings.Contains(progress.String(), "handler webhook → http://127.0.0.1:") {
		t.Errorf("the header does not name the handler:\n%s", progress.String())
	}
	var out bytes.Buffer
	bench.Print(&out, rep)
	for _, want := range []string{"handler webhook", "webhook sink"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"handler":"webhook"`, `"handler_sleep":"none"`, `"sink_requests":`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s: %s", want, b)
		}
	}

	rows, err := db.Pool.Query(context.Background(), `SELECT id, attempt_count, status FROM ingest_task`)
	if err != nil {
		t.Fatal(err)
	}
	var n, chosen int64
	for rows.Next() {
		var id uuid.UUID
		var failures int
		var status string
		if err := rows.Scan(&id, &failures, &status); err != nil {
			t.Fatal(err)
		}
		n++
		want := 0
		if bench.FailsFirstAttempt(id[:], rate) {
			want = 1
			chosen++
		}
		if failures != want || status != "SUCCEEDED" {
			t.Errorf("task %s: %d failed runs, %s; want %d, SUCCEEDED", id, failures, status, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != tasks || chosen != rep.FailedAttempts {
		t.Errorf("%d tasks, %d chosen to fail; the report says %d failed", n, chosen, rep.FailedAttempts)
	}
}

func TestFailsFirstAttempt(t *testing.T) {
	t.Parallel()
	id := []byte("0123456789abcdef")
	if bench.FailsFirstAttempt(id, 0) {
		t.Error("rate 0 fails a task")
	}
	if !bench.FailsFirstAttempt(id, 1) {
		t.Error("rate 1 lets a task pass")
	}
	const n, rate = 100000, 0.05
	failed := 0
	for i := range n {
		key := binary.BigEndian.AppendUint64(nil, uint64(i))
		a, b := bench.FailsFirstAttempt(key, rate), bench.FailsFirstAttempt(key, rate)
		if a != b {
			t.Fatalf("key %d: %v, then %v", i, a, b)
		}
		if a {
			failed++
		}
	}
	// 5,000 expected, standard deviation 69.
	if failed < 4600 || failed > 5400 {
		t.Errorf("%d of %d keys fail at rate %v", failed, n, rate)
	}
}

func TestValidatePayloadFailRateAndHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts bench.Options
		want string // "" for valid
	}{
		{bench.Options{PayloadBytes: 1024, FailRate: 0.5}, ""},
		{bench.Options{PayloadBytes: -1}, "payload bytes"},
		{bench.Options{PayloadBytes: bench.MaxPayloadBytes + 1}, "payload bytes"},
		{bench.Options{FailRate: -0.1}, "fail rate"},
		{bench.Options{FailRate: 1}, "fail rate"},
		{bench.Options{FailRate: math.NaN()}, "fail rate"},
		{bench.Options{Handler: bench.HandlerWebhook, FailRate: 0.1}, ""},
		{bench.Options{Handler: bench.HandlerNoop, HandlerSleep: time.Millisecond}, ""},
		{bench.Options{Handler: "http"}, `handler must be one of noop, webhook, got "http"`},
		{bench.Options{Handler: bench.HandlerWebhook, HandlerSleep: time.Millisecond}, "handler sleep"},
		{bench.Options{Preload: true, PublishFirst: true}, ""},
		{bench.Options{PublishFirst: true}, "publish-first applies to preload mode only"},
		// Not narrowed to pgx's int32 (4294967300 was a pool of 4).
		{bench.Options{PoolConns: 4294967300}, "pool conns must be in [4, 10000]"},
		{bench.Options{Rate: math.NaN()}, "rate must be >= 0"},
	} {
		err := tc.opts.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.opts, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want one naming %q", tc.opts, err, tc.want)
		}
	}
}
