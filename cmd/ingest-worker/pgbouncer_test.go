package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/webhook"
)

// listeners counts the sessions LISTENing on the database of pool (a
// direct pool: PostgreSQL's own view), by application name.
func listeners(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT application_name, count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query ILIKE 'LISTEN%' GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var name string
		var n int
		if err := rows.Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		out[name] = n
	}
	return out
}

// bouncerListeners counts PgBouncer's clients that are LISTEN connections
// (their application names end in -listener).
func bouncerListeners(t *testing.T, b *testenv.PgBouncer) int {
	t.Helper()
	n := 0
	for _, c := range b.Clients(t) {
		if strings.HasSuffix(c.ApplicationName, "-listener") {
			n++
		}
	}
	return n
}

// TestBinaryThroughPgBouncer: every command through a transaction-pooling
// PgBouncer (Debian's pgbouncer 1.18, which keeps no prepared statements).
// migrate refuses without a direct connection and applies through
// INGEST_DATABASE_LISTEN_URL; a worker with that URL LISTENs on PostgreSQL
// directly and never through the bouncer; a task succeeds, one is retried
// and succeeds, one ends DEAD with its DLQ entry; a worker is SIGKILLed in
// the middle of a task and a second worker, without a listen URL (so it
// polls), finishes it; task show, list and cancel, dlq list and replay,
// kind list, pending, migrate --status and the demo work through the
// bouncer.
func TestBinaryThroughPgBouncer(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	ctx := context.Background()
	db := testenv.NewEmptyDatabase(t)
	bouncer := testenv.NewPgBouncer(t)
	stream, dlqKey := testenv.Keys(t)
	rdb := testenv.Redis(t)
	rc, hook := newReceiver(t, func(w http.ResponseWriter, r *http.Request, req webhook.Request) {
		switch {
		case req.Kind == "pgb.flaky" && req.Attempt == 1, req.Kind == "pgb.dead":
			http.Error(w, "try again", http.StatusServiceUnavailable)
		case req.Kind == "pgb.slow" && req.Attempt == 1:
			<-r.Context().Done() // until its worker is killed
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
	base := []string{
		"INGEST_DATABASE_URL=" + bouncer.URL(t, db.URL), "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
	}
	direct := "INGEST_DATABASE_LISTEN_URL=" + db.URL

	// A malformed listen URL stops every command, naming the variable and
	// hiding the password.
	const pw = "pw-Listen-7"
	r := runBin(t, bin, append(base, "INGEST_DATABASE_LISTEN_URL=postgres://app:"+pw+"@db:port/x"), "", "task", "list")
	if r.code != exitUsage || !strings.Contains(r.stderr, "INGEST_DATABASE_LISTEN_URL") || strings.Contains(r.stdout+r.stderr, pw) {
		t.Fatalf("a malformed INGEST_DATABASE_LISTEN_URL: exit %d, stderr %q; want 2 naming the variable, without the password", r.code, r.stderr)
	}

	// migrate needs a session for its lock: refused through the bouncer
	// alone, naming the setting that fixes it; applied through the direct
	// URL; --status reads through the bouncer.
	r = runBin(t, bin, base, "", "migrate")
	if r.code != exitUsage || !strings.Contains(r.stderr, "INGEST_DATABASE_LISTEN_URL") || !strings.Contains(r.stderr, "pooler") {
		t.Fatalf("migrate through PgBouncer alone: exit %d, stderr %q; want 2 naming INGEST_DATABASE_LISTEN_URL", r.code, r.stderr)
	}
	if out := mustRun(t, bin, base, "", "migrate", "--status"); !strings.Contains(out, "pending migrations") {
		t.Fatalf("migrate --status after the refusal: %s; want pending migrations (nothing applied)", out)
	}
	mustRun(t, bin, append(base, direct), "", "migrate")
	if out := mustRun(t, bin, base, "", "migrate", "--status"); !strings.Contains(out, "up to date") {
		t.Fatalf("migrate --status through PgBouncer: %s", out)
	}

	workerEnv := append(base, "INGEST_WEBHOOK_URL="+hook.URL+"/hook",
		"INGEST_REDIS_RETRY_BASE_BACKOFF_MS=0", "INGEST_REDIS_RETRY_MAX_BACKOFF_MS=0",
		"INGEST_TASK_LEASE_MS=1000", "INGEST_REDIS_RECLAIM_INTERVAL_MS=200", "INGEST_REDIS_RECLAIM_IDLE_MS=500",
		"INGEST_OUTBOX_PUBLISH_INTERVAL_MS=200", "INGEST_SHUTDOWN_TIMEOUT_MS=2000")

	// A listen URL that is itself the bouncer's is refused.
	r = runBin(t, bin, append(workerEnv, "INGEST_DATABASE_LISTEN_URL="+bouncer.URL(t, db.URL), "INGEST_HTTP_ADDR="), "", "run")
	if r.code != exitUsage || !strings.Contains(r.stderr, "INGEST_DATABASE_LISTEN_URL") {
		t.Fatalf("run with a pooled listen URL: exit %d, stderr %q; want 2 naming INGEST_DATABASE_LISTEN_URL", r.code, r.stderr)
	}

	addrA := freeAddr(t)
	nameA := "pgb-a-" + uuid.NewString()[:6]
	a := start(t, bin, append(workerEnv, direct, "INGEST_CONSUMER_NAME="+nameA), "run", "--http-addr", addrA)
	waitReady(t, a, addrA)
	testenv.Eventually(t, 15*time.Second, "worker A's outbox and cancel listeners LISTENing on PostgreSQL directly", func() bool {
		l := listeners(t, db.Pool)
		return l["ingest-outbox-listener"] == 1 && l["ingest-cancel-listener"] == 1
	})
	if n := bouncerListeners(t, bouncer); n != 0 {
		t.Errorf("%d LISTEN connections through PgBouncer, want none: %+v", n, bouncer.Clients(t))
	}

	enqueue := func(kind string, extra ...string) uuid.UUID {
		t.Helper()
		out := mustRun(t, bin, base, "", append([]string{"enqueue", "--kind", kind, "--payload", `{"n":1}`}, extra...)...)
		return uuid.MustParse(strings.TrimSpace(out))
	}
	status := func(id uuid.UUID) (string, int) {
		t.Helper()
		var s string
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT status, attempt_count FROM ingest_task WHERE id = $1`, id).Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		return s, n
	}
	ok, flaky, dead := enqueue("pgb.ok"), enqueue("pgb.flaky"), enqueue("pgb.dead", "--max-attempts", "2")
	testenv.Eventually(t, 20*time.Second, "ok and flaky SUCCEEDED, dead DEAD", func() bool {
		a.mustBeRunning()
		s1, _ := status(ok)
		s2, _ := status(flaky)
		s3, _ := status(dead)
		return s1 == "SUCCEEDED" && s2 == "SUCCEEDED" && s3 == "DEAD"
	})
	if s, n := status(flaky); n != 1 || rc.count(flaky) != 2 {
		t.Errorf("flaky: %s with attempt_count %d after %d runs; want one failed run, then success", s, n, rc.count(flaky))
	}
	if _, n := status(dead); n != 2 || rc.count(dead) != 2 {
		t.Errorf("dead: attempt_count %d after %d runs, want 2 and 2", n, rc.count(dead))
	}
	var dlqID string
	testenv.Eventually(t, 10*time.Second, "dead's DLQ entry", func() bool {
		msgs, err := rdb.XRange(ctx, dlqKey, "-", "+").Result()
		if err != nil || len(msgs) != 1 || msgs[0].Values["task_id"] != dead.String() {
			return false
		}
		dlqID = msgs[0].ID
		return true
	})

	// A worker SIGKILLed in the middle of a task; another one, without a
	// listen URL (it polls), takes the task over once the lease expires.
	slow := enqueue("pgb.slow")
	testenv.Eventually(t, 20*time.Second, "worker A running the slow task", func() bool { return rc.count(slow) == 1 })
	a.signal(syscall.SIGKILL)
	a.wait(10 * time.Second)
	addrB := freeAddr(t)
	nameB := "pgb-b-" + uuid.NewString()[:6]
	b := start(t, bin, append(workerEnv, "INGEST_CONSUMER_NAME="+nameB), "run", "--http-addr", addrB)
	waitReady(t, b, addrB)
	testenv.Eventually(t, 30*time.Second, "the slow task SUCCEEDED on worker B", func() bool {
		b.mustBeRunning()
		s, _ := status(slow)
		return s == "SUCCEEDED"
	})
	var finisher string
	if err := db.Pool.QueryRow(ctx, `SELECT worker FROM ingest_task_transition WHERE task_id = $1 AND to_status = 'SUCCEEDED'`, slow).Scan(&finisher); err != nil || finisher != nameB {
		t.Errorf("the slow task was finished by %q (%v), want worker B %q", finisher, err, nameB)
	}
	if !strings.Contains(b.stderr.String(), "INGEST_DATABASE_LISTEN_URL is not set: nothing LISTENs") {
		t.Errorf("worker B does not say that it polls:\n%s", b.stderr.String())
	}
	// Tasks another process creates are published by B's polling.
	late := enqueue("pgb.ok")
	testenv.Eventually(t, 10*time.Second, "a task created while only B runs SUCCEEDED", func() bool {
		s, _ := status(late)
		return s == "SUCCEEDED"
	})
	testenv.Eventually(t, 10*time.Second, "no LISTEN session left (A is dead, B polls)", func() bool { return len(listeners(t, db.Pool)) == 0 })
	if n := bouncerListeners(t, bouncer); n != 0 {
		t.Errorf("%d LISTEN connections through PgBouncer, want none: %+v", n, bouncer.Clients(t))
	}

	// The read commands, through the bouncer.
	if out := mustRun(t, bin, base, "", "task", "show", dead.String()); !strings.Contains(out, "DEAD") || !strings.Contains(out, "RETRYING") {
		t.Errorf("task show %s: want its DEAD status and RETRYING in its history:\n%s", dead, out)
	}
	if out := mustRun(t, bin, base, "", "task", "list", "--status", "SUCCEEDED", "--json"); !strings.Contains(out, slow.String()) || !strings.Contains(out, ok.String()) {
		t.Errorf("task list --status SUCCEEDED: want %s and %s:\n%s", slow, ok, out)
	}
	if out := mustRun(t, bin, base, "", "dlq", "list"); !strings.Contains(out, dead.String()) {
		t.Errorf("dlq list: want %s:\n%s", dead, out)
	}
	if out := mustRun(t, bin, base, "", "pending", "--json"); !strings.Contains(out, `"SUCCEEDED"`) {
		t.Errorf("pending --json: want the task counts:\n%s", out)
	}
	if out := mustRun(t, bin, base, "", "kind", "list"); !strings.Contains(out, "pgb.slow") {
		t.Errorf("kind list: want pgb.slow:\n%s", out)
	}
	b.signal(syscall.SIGTERM)
	if code := b.wait(20 * time.Second); code != 0 {
		t.Errorf("worker B exited with %d after SIGTERM:\n%s", code, b.stderr.String())
	}

	// With no worker left: the DEAD task replayed from the DLQ (QUEUED
	// again, its entry gone), then cancelled.
	mustRun(t, bin, base, "", "dlq", "replay", dlqID)
	if st, _ := status(dead); st != "QUEUED" {
		t.Errorf("dlq replay: the task is %s, want QUEUED", st)
	}
	if n, err := rdb.XLen(ctx, dlqKey).Result(); err != nil || n != 0 {
		t.Errorf("dlq replay: %d DLQ entries left (%v), want 0", n, err)
	}
	mustRun(t, bin, base, "", "task", "cancel", dead.String(), "--reason", "test")
	if st, _ := status(dead); st != "CANCELLED" {
		t.Errorf("task cancel: the task is %s, want CANCELLED", st)
	}

	// The demo, on this database through the bouncer: its migration goes
	// over the direct URL, its script runs to the end.
	r = runBin(t, bin, append(base, direct, "INGEST_HTTP_ADDR="), "", "demo", "--json", "--timeout", "40s")
	if r.code != 0 || !strings.Contains(r.stdout, "demo.permanent") {
		t.Errorf("demo through PgBouncer: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}
