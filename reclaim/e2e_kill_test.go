package reclaim_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// helperEnv, when set, makes the test binary run helperMain: one worker
// process with a reclaimer, configured by the helper* variables.
const (
	helperEnv      = "INGEST_RECLAIM_TEST_HELPER"
	helperDB       = "INGEST_RECLAIM_TEST_DB"
	helperRedis    = "INGEST_RECLAIM_TEST_REDIS"
	helperStream   = "INGEST_RECLAIM_TEST_STREAM"
	helperDLQ      = "INGEST_RECLAIM_TEST_DLQ"
	helperConsumer = "INGEST_RECLAIM_TEST_CONSUMER"
	// helperDefaultsLease, when set (a lease in ms), makes the helper a
	// worker process with the default settings (ingest.Service, every
	// setting zero) but that task lease.
	helperDefaultsLease = "INGEST_RECLAIM_TEST_DEFAULTS_LEASE_MS"

	helperMinIdle = 500 * time.Millisecond
	helperLease   = 300 * time.Millisecond
)

// helperMain runs a worker and its reclaimer until SIGTERM. Its handlers:
// "ok" succeeds; "kill" kills the whole process with SIGKILL, like a
// handler that crashes it (out of memory, a fatal runtime error).
func helperMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(err error) int {
		logger.Error("helper worker", "err", err)
		return 2
	}
	pool, err := pgxpool.New(ctx, os.Getenv(helperDB))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	opt, err := redis.ParseURL(os.Getenv(helperRedis))
	if err != nil {
		return fail(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	store, err := task.NewStore(task.Config{Stream: os.Getenv(helperStream)}, pool)
	if err != nil {
		return fail(err)
	}
	consumer := os.Getenv(helperConsumer)
	if ms := os.Getenv(helperDefaultsLease); ms != "" {
		return helperService(ctx, pool, rdb, logger, consumer, ms)
	}
	svc, err := ingest.NewService(ingest.Config{
		Stream: os.Getenv(helperStream), Group: group, DLQ: os.Getenv(helperDLQ), Consumer: consumer,
		Concurrency: 16, TaskLease: helperLease, ReclaimIdle: helperMinIdle,
		Block: 100 * time.Millisecond, ShutdownTimeout: 2 * time.Second,
		Store:         store.Config(),
		Reclaim:       reclaim.Config{Interval: 100 * time.Millisecond},
		RelayDisabled: true,
		// The worker and its reclaimer only: no leader's services.
		Maintenance: maintenance.Config{RescuerDisabled: true, RetentionDisabled: true, ConsumersDisabled: true, ReleaserDisabled: true},
	}, pool, ingest.Redis(rdb), logger, nil)
	if err != nil {
		return fail(err)
	}
	svc.Handle("ok", func(context.Context, ingest.Task) error { return nil })
	svc.Handle("kill", func(ctx context.Context, _ ingest.Task) error {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		<-ctx.Done()
		return ctx.Err()
	})
	if err := svc.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// helperService runs an ingest.Service with the default settings but a
// task lease of leaseMS until ctx is done. Its handler "hang-first" blocks
// on its first attempt (until the process is killed) and succeeds on the
// next.
func helperService(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client, logger *slog.Logger, consumer, leaseMS string) int {
	ms, err := strconv.Atoi(leaseMS)
	if err != nil {
		logger.Error("helper worker", "err", err)
		return 2
	}
	svc, err := ingest.NewService(ingest.Config{Stream: os.Getenv(helperStream), Group: group, DLQ: os.Getenv(helperDLQ), Consumer: consumer,
		TaskLease: time.Duration(ms) * time.Millisecond}, pool, ingest.Redis(rdb), logger, nil)
	if err != nil {
		logger.Error("helper worker", "err", err)
		return 2
	}
	svc.Handle("hang-first", func(ctx context.Context, t ingest.Task) error {
		if t.Attempt == 1 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	if err := svc.Run(ctx); err != nil {
		logger.Error("helper worker", "err", err)
		return 2
	}
	return 0
}

// helperProc is a started helper worker process.
type helperProc struct {
	name   string
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{} // closed when it exited
	err    error         // Wait's result, once done
}

func startHelper(t *testing.T, e *env, name string, env ...string) *helperProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		helperEnv+"=1", helperDB+"="+e.db.URL, helperRedis+"="+e.redisURL,
		helperStream+"="+e.stream, helperDLQ+"="+e.dlq, helperConsumer+"="+name)
	cmd.Env = append(cmd.Env, env...)
	h := &helperProc{name: name, cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stderr = h.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper worker: %v", err)
	}
	go func() {
		h.err = cmd.Wait()
		close(h.done)
	}()
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			_ = cmd.Process.Kill()
			<-h.done
		}
	})
	return h
}

func (h *helperProc) killedBySIGKILL() bool {
	var ee *exec.ExitError
	if !errors.As(h.err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// TestE2EProcessKillingTaskGoesDead: a task whose handler kills its worker
// process every time goes DEAD (and to the DLQ) after max attempts, each
// abandoned run counted by the takeover of its expired lease, while 1000
// other tasks complete and every entry is acknowledged; it does not loop
// forever.
func TestE2EProcessKillingTaskGoesDead(t *testing.T) {
	t.Parallel()
	const maxAttempts = 3
	ctx := context.Background()
	e := newEnv(t, task.Config{})
	e.create(t, "ok", 500, 0)
	killer := e.create(t, "kill", 1, maxAttempts)[0]
	e.create(t, "ok", 500, 0)
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)

	done := func() bool {
		tk, err := e.store.Get(ctx, killer)
		if err != nil {
			t.Fatal(err)
		}
		// Every entry acknowledged as well: a helper killed after a
		// completion committed but before its XACK leaves that entry
		// pending until a live helper's reclaimer claims it (after the
		// min-idle time) and finds the task finished.
		return tk.Status == task.Dead && e.statusCount(t, task.Succeeded) == 1000 && pendingCount(t, e) == 0
	}
	procs := []*helperProc{}
	defer func() {
		if t.Failed() {
			for _, p := range procs {
				_ = p.cmd.Process.Kill() // no-op once it exited
				<-p.done
				t.Logf("helper %s stderr:\n%s", p.name, p.stderr.String())
			}
		}
	}()
	deaths := 0
	deadline := time.Now().Add(90 * time.Second)
	for i := 1; ; i++ {
		h := startHelper(t, e, fmt.Sprintf("helper-%d", i))
		procs = append(procs, h)
		if !waitKilledOrDone(t, h, deadline, done) {
			break // done; h stopped gracefully
		}
		deaths++
		t.Logf("helper %s killed by its task (death %d)", h.name, deaths)
		if deaths > maxAttempts {
			t.Fatalf("%d workers killed; the task should be DEAD after %d attempts", deaths, maxAttempts)
		}
	}
	if deaths != maxAttempts {
		t.Errorf("%d workers killed, want %d (one per attempt)", deaths, maxAttempts)
	}
	tk, recs, err := e.store.GetWithTransitions(ctx, killer)
	if err != nil {
		t.Fatal(err)
	}
	if tk.AttemptCount != maxAttempts {
		t.Errorf("killer: attempt_count %d, want %d", tk.AttemptCount, maxAttempts)
	}
	var trail []string
	takeovers := 0
	for _, r := range recs {
		trail = append(trail, fmt.Sprintf("%s→%s(%d) %s", r.From, r.To, r.AttemptCount, r.Message))
		if r.From == "RUNNING" && strings.Contains(r.Message, "abandoned") {
			takeovers++
		}
	}
	if takeovers != maxAttempts || recs[len(recs)-1].To != "DEAD" {
		t.Errorf("killer audit:\n%s\nwant %d abandoned runs, the last one to DEAD", strings.Join(trail, "\n"), maxAttempts)
	}
	dlq, err := e.rdb.XRange(ctx, e.dlq, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(dlq) != 1 || dlq[0].Values["task_id"] != killer.String() {
		t.Errorf("DLQ %v, want one entry for the killer task %s", dlq, killer)
	}
	if n := pendingCount(t, e); n != 0 {
		t.Errorf("%d entries still pending, want 0", n)
	}
}

// waitKilledOrDone waits until helper h is killed by SIGKILL (true) or done
// holds (then it stops h with SIGTERM and returns false).
func waitKilledOrDone(t *testing.T, h *helperProc, deadline time.Time, done func() bool) bool {
	t.Helper()
	for {
		select {
		case <-h.done:
			if !h.killedBySIGKILL() {
				t.Fatalf("helper %s exited without SIGKILL: %v", h.name, h.err)
			}
			return true
		case <-time.After(20 * time.Millisecond): // polling period
		}
		if done() {
			if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-h.done:
			case <-time.After(15 * time.Second):
				t.Fatal("helper did not stop on SIGTERM")
			}
			if h.err != nil {
				t.Fatalf("helper %s stopped with %v", h.name, h.err)
			}
			return false
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out; helper %s running", h.name)
		}
	}
}

// TestE2EKilledWorkerTakenOverWithDefaultSettings: a worker process with
// the default settings (reclaim idle time 10 minutes, a reclaim round every
// 5 s) but a task lease of 2 s is killed with SIGKILL while it runs a task;
// another such process takes the task over about one lease plus a reclaim
// round later, not after the reclaim idle time: the entry's task is
// RUNNING under an expired lease and its consumer has been silent for a
// lease. The abandoned run counts as a failed attempt.
func TestE2EKilledWorkerTakenOverWithDefaultSettings(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	if d := (ingest.Config{}).WithDefaults(); d.ReclaimIdle != 10*time.Minute {
		t.Fatalf("default reclaim idle %s: the test assumes 10 minutes", d.ReclaimIdle)
	}
	ctx := context.Background()
	e := newEnv(t, task.Config{})
	id := e.create(t, "hang-first", 1, 3)[0]
	reclaim.PublishOutbox(t, e.pool(), e.rdb, e.stream)
	leaseEnv := fmt.Sprintf("%s=%d", helperDefaultsLease, lease.Milliseconds())
	procs := []*helperProc{}
	defer func() {
		if t.Failed() {
			for _, p := range procs {
				_ = p.cmd.Process.Kill() // no-op once it exited
				<-p.done
				t.Logf("helper %s stderr:\n%s", p.name, p.stderr.String())
			}
		}
	}()
	h1 := startHelper(t, e, "helper-1", leaseEnv)
	procs = append(procs, h1)
	get := func() task.Task {
		tk, err := e.store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	testenv.Eventually(t, 60*time.Second, "helper-1 runs the task", func() bool {
		tk := get()
		return tk.Status == task.Running && tk.LeaseOwner == "helper-1"
	})
	if err := h1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-h1.done
	killed := time.Now()
	h2 := startHelper(t, e, "helper-2", leaseEnv)
	procs = append(procs, h2)
	// Lease (2 s) + a round (5 s) + start-up; 30 leases is generous for a
	// loaded machine and far below the reclaim idle time.
	testenv.Eventually(t, 30*lease, "the task taken over and SUCCEEDED", func() bool { return get().Status == task.Succeeded })
	took := time.Since(killed)
	tk, recs, err := e.store.GetWithTransitions(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var takenOver time.Time
	for _, r := range recs {
		if r.From == "RUNNING" && strings.Contains(r.Message, "helper-1") && strings.Contains(r.Message, "abandoned") {
			takenOver = r.CreatedAt
		}
	}
	if takenOver.IsZero() || tk.AttemptCount != 1 {
		t.Errorf("task %+v, transitions %+v: want helper-1's run abandoned by a takeover and counted as one failed attempt", tk, recs)
	}
	t.Logf("SIGKILL → SUCCEEDED on helper-2: %s (lease %s, reclaim idle 10m, reclaim round 5s); takeover recorded %s after the kill",
		took.Round(10*time.Millisecond), lease, takenOver.Sub(killed).Round(10*time.Millisecond))
	if err := h2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h2.done:
	case <-time.After(60 * time.Second):
		t.Fatal("helper-2 did not stop on SIGTERM")
	}
}
