//go:build reliability

package chaos

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

var longFlag = flag.Bool("long", false, "run the long form of the reliability suite (or INGEST_CHAOS_LONG=1)")

// long reports whether the long form runs.
func long() bool { return *longFlag || os.Getenv("INGEST_CHAOS_LONG") == "1" }

// timingBound reports a missed timing bound (a latency percentile, a
// throughput ratio): a failure in the long form, which runs on a machine
// set aside for it; in the short form, which CI runs beside other work on
// a loaded machine, it is logged, and the scenario's row still shows the
// figure. Lost, stuck and duplicated tasks fail both forms.
func timingBound(t *testing.T, format string, args ...any) {
	t.Helper()
	if long() {
		t.Errorf(format, args...)
		return
	}
	t.Logf("timing bound missed (enforced in the long form only): "+format, args...)
}

// size returns short or long by the form that runs.
func size(short, lng int) int {
	if long() {
		return lng
	}
	return short
}

// workerBin is the chaosworker binary built by TestMain.
var workerBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "ingest-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workerBin = filepath.Join(dir, "chaosworker")
	if err := goBuild(workerBin, "github.com/ingest-worker/ingest/cmd/chaosworker", raceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testenv.MainWith(m, func() {
		writeReport()
		_ = os.RemoveAll(dir)
	})
}

// goBuild builds pkg into out, with -race if race.
func goBuild(out, pkg string, race bool) error {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the reliability suite builds its worker processes and needs the go command on PATH: %w", err)
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command(gobin, append(args, pkg)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// cluster is one scenario's world: a PostgreSQL server and a redis-server
// of its own, and the worker processes on them.
type cluster struct {
	t      *testing.T
	pg     *testenv.PostgresServer
	db     *testenv.Database
	redis  *testenv.RedisServer
	secret string // the Redis password; must appear in no log line
	// extraSecrets (ACL users' passwords) must not either.
	extraSecrets []string
	redisURL     string // with the password
	admin        *redis.Client
	store        *task.Store
	stream       string
	dlq          string
	dir          string
	env          []string // common worker environment

	mu    sync.Mutex
	procs []*proc

	killed map[string]bool // consumer names of SIGKILLed workers (under mu)
	// killedAt is when each SIGKILLed worker was gone (under mu): its
	// handlers' runs ended by then.
	killedAt map[string]time.Time
	crashes  atomic.Int64 // unexpected process exits
	faults   atomic.Int64
	inflight atomic.Int64 // tasks in flight at the moments of the faults
}

// clusterOptions shape a cluster.
type clusterOptions struct {
	// redisArgs are extra redis-server arguments.
	redisArgs []string
	// env is added to every worker's environment.
	env []string
	// ownPostgres runs a PostgreSQL server for this cluster alone (to
	// restart it); otherwise the database is on the shared test server.
	ownPostgres bool
}

func newCluster(t *testing.T, o clusterOptions) *cluster {
	t.Helper()
	c := &cluster{t: t, dir: t.TempDir(), secret: "pw-" + randomHex(12)}
	if o.ownPostgres {
		c.pg = testenv.NewPostgresServer(t)
		c.db = testenv.NewMigratedDatabase(t, c.pg)
	} else {
		c.db = testenv.NewDatabase(t)
	}
	c.redis = testenv.NewRedisServer(t, append([]string{"--requirepass", c.secret}, o.redisArgs...)...)
	c.redisURL = fmt.Sprintf("redis://:%s@%s/0", c.secret, c.redis.Addr())
	opt, err := redis.ParseURL(c.redisURL)
	if err != nil {
		t.Fatal(err)
	}
	c.admin = redis.NewClient(opt)
	t.Cleanup(func() { c.admin.Close() })
	c.stream, c.dlq = testenv.Keys(t)
	c.store, err = task.NewStore(task.Config{Stream: c.stream}, c.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.db.Pool.Exec(context.Background(), `CREATE TABLE chaos_effect (task_id uuid NOT NULL, run_at timestamptz NOT NULL, worker text NOT NULL);
		CREATE INDEX ON chaos_effect (task_id);
		CREATE TABLE chaos_run (task_id uuid NOT NULL, worker text NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	c.env = append([]string{
		"CHAOS_DATABASE_URL=" + c.db.URL,
		"CHAOS_REDIS_URL=" + c.redisURL,
		"CHAOS_STREAM=" + c.stream,
		"CHAOS_DLQ=" + c.dlq,
	}, o.env...)
	t.Cleanup(c.stopAll)
	t.Cleanup(c.checkLogsForSecrets)
	return c
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// proc is one worker (or relay) process, restarted under a new consumer
// name after each kill.
type proc struct {
	c    *cluster
	name string
	env  []string
	log  string

	mu       sync.Mutex
	gen      int
	consumer string
	cmd      *exec.Cmd
	expected bool // the next exit is caused by the suite
	done     chan struct{}
	stopped  bool // stopAll ran: no restarts
}

// spawn starts n worker processes named prefix0..prefixN-1 with extra env.
func (c *cluster) spawn(prefix string, n int, env ...string) []*proc {
	c.t.Helper()
	var ps []*proc
	for i := range n {
		p := &proc{c: c, name: fmt.Sprintf("%s%d", prefix, i), env: env}
		p.log = filepath.Join(c.dir, p.name+".log")
		if err := p.start(); err != nil {
			c.t.Fatal(err)
		}
		c.mu.Lock()
		c.procs = append(c.procs, p)
		c.mu.Unlock()
		ps = append(ps, p)
	}
	return ps
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil
	}
	p.gen++
	p.consumer = fmt.Sprintf("%s-%d", p.name, p.gen)
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(workerBin)
	cmd.Env = append(append(append(os.Environ(), p.c.env...), p.env...), "CHAOS_CONSUMER="+p.consumer)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.expected, p.done = cmd, false, make(chan struct{})
	done := p.done
	go func() {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		expected, stopped := p.expected, p.stopped
		p.mu.Unlock()
		close(done)
		if expected || stopped {
			return
		}
		// A crash: count it, and restart so the scenario can finish.
		p.c.crashes.Add(1)
		p.c.t.Logf("%s (%s) exited on its own: %v; last log lines:\n%s", p.name, p.consumer, err, tail(p.log, 8))
		time.AfterFunc(200*time.Millisecond, func() { _ = p.start() })
	}()
	return nil
}

// Consumer returns the current consumer name.
func (p *proc) Consumer() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.consumer
}

// signal sends sig to the process, marking the exit it causes as expected.
func (p *proc) signal(sig syscall.Signal) (done chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		p.expected = true
	}
	_ = p.cmd.Process.Signal(sig)
	return p.done
}

// kill SIGKILLs the process, waits for it to be gone and restarts it under
// a new consumer name. It returns the dead consumer's name.
func (p *proc) kill() string {
	c := p.c
	old := p.Consumer()
	<-p.signal(syscall.SIGKILL)
	c.mu.Lock()
	if c.killed == nil {
		c.killed = map[string]bool{}
	}
	c.killed[old] = true
	if c.killedAt == nil {
		c.killedAt = map[string]time.Time{}
	}
	c.killedAt[old] = time.Now()
	c.mu.Unlock()
	// The tasks it held are counted when verifying: those taken over
	// from it.
	c.faults.Add(1)
	if err := p.start(); err != nil {
		c.t.Error(err)
	}
	return old
}

func (c *cluster) killedConsumers() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]bool, len(c.killed))
	for k := range c.killed {
		m[k] = true
	}
	return m
}

// stopAll kills every process (continuing frozen ones first).
func (c *cluster) stopAll() {
	c.mu.Lock()
	ps := c.procs
	c.mu.Unlock()
	for _, p := range ps {
		p.mu.Lock()
		p.stopped = true
		cmd := p.cmd
		p.mu.Unlock()
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, p := range ps {
		<-p.done
	}
}

// checkLogsForSecrets fails the test if any worker log line holds the
// Redis password.
func (c *cluster) checkLogsForSecrets() {
	c.mu.Lock()
	ps := c.procs
	c.mu.Unlock()
	for _, p := range ps {
		f, err := os.Open(p.log)
		if err != nil {
			continue
		}
		s := bufio.NewScanner(f)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			for _, secret := range append([]string{c.secret}, c.extraSecrets...) {
				if strings.Contains(s.Text(), secret) {
					c.t.Errorf("%s logged a Redis password: %s", p.name, strings.ReplaceAll(s.Text(), secret, "<SECRET>"))
				}
			}
		}
		f.Close()
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// enqueue creates n tasks of kind in batches; payload "ms" is the ok
// handler's work time.
func (c *cluster) enqueue(kind string, n, ms, maxAttempts int) {
	c.t.Helper()
	const batch = 500
	for done := 0; done < n; done += batch {
		nts := make([]task.NewTask, min(batch, n-done))
		for i := range nts {
			p, _ := json.Marshal(map[string]any{"ms": ms, "n": done + i, "r": randomHex(4)})
			nts[i] = task.NewTask{Kind: kind, Payload: p, MaxAttempts: maxAttempts}
		}
		if _, err := c.store.CreateBatch(context.Background(), nts); err != nil {
			c.t.Fatalf("enqueue: %v", err)
		}
	}
}

// query runs a one-value query, returning -1 on an error (a server may be
// down).
func (c *cluster) query(sql string, args ...any) int {
	return c.queryWithin(5*time.Second, sql, args...)
}

// queryWithin is query bounded by d instead: a final check's query over
// the whole run's audit rows takes seconds on a loaded machine (the long
// form's pipeline check once passed 5 s).
func (c *cluster) queryWithin(d time.Duration, sql string, args ...any) int {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var n int
	if err := c.db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return -1
	}
	return n
}

func (c *cluster) count(status task.State) int {
	return c.query(`SELECT count(*) FROM ingest_task WHERE status = $1`, string(status))
}

func (c *cluster) running() int { return c.count(task.Running) }

func (c *cluster) runningUnder(consumer string) int {
	return c.query(`SELECT count(*) FROM ingest_task WHERE status = 'RUNNING' AND lease_owner = $1`, consumer)
}

// fault records a fault injected while tasks were in flight.
func (c *cluster) fault(inflight int) {
	c.faults.Add(1)
	c.inflight.Add(int64(max(0, inflight)))
}

// eventually polls cond every 50 ms until it holds, or fails the test
// after timeout.
func (c *cluster) eventually(timeout time.Duration, what string, cond func() bool) time.Duration {
	c.t.Helper()
	took, ok := poll(timeout, cond)
	if !ok {
		c.t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
	return took
}

// poll checks cond every 50 ms until it holds or timeout has passed, and
// returns how long that took and whether it held.
func poll(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start), true
}

// resumed returns how long it took, from since, until a task started
// after since succeeded: work resumed (tasks that were in flight during the
// fault do not count).
func (c *cluster) resumed(since time.Time, timeout time.Duration) time.Duration {
	c.t.Helper()
	var first time.Time
	c.eventually(timeout, "work to resume", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := c.db.Pool.QueryRow(ctx, `SELECT min(s.created_at) FROM ingest_task_transition s
			JOIN ingest_task_transition r ON r.task_id = s.task_id AND r.to_status = 'RUNNING' AND r.created_at > $1
			WHERE s.to_status = 'SUCCEEDED' AND s.created_at > $1 AND s.id > r.id`, since).Scan(&first)
		return err == nil && !first.IsZero()
	})
	return first.Sub(since)
}

// settledBefore returns how long it took, from since, until every task
// created before since was SUCCEEDED or DEAD.
func (c *cluster) settledBefore(since time.Time, timeout time.Duration) time.Duration {
	c.t.Helper()
	var last time.Time
	c.eventually(timeout, "the tasks created before the fault to finish", func() bool {
		return c.query(`SELECT count(*) FROM ingest_task WHERE created_at < $1 AND status IN ('QUEUED', 'RUNNING', 'RETRYING')`, since) == 0
	})
	_ = c.db.Pool.QueryRow(context.Background(), `SELECT max(finished_at) FROM ingest_task WHERE created_at < $1`, since).Scan(&last)
	return max(0, last.Sub(since))
}

// pending returns the group's XPENDING count (-1 on an error).
func (c *cluster) pending() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p, err := c.admin.XPending(ctx, c.stream, "ingest-workers").Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// pendingSettle bounds the wait for entries delivered at the end of a
// scenario to be acked (milliseconds each).
const pendingSettle = 10 * time.Second

// pendingAfter returns the group's XPENDING count once it is 0, or after
// timeout has passed.
func (c *cluster) pendingAfter(timeout time.Duration) int64 {
	var p int64
	poll(timeout, func() bool { p = c.pending(); return p == 0 })
	return p
}

// waitQuiet waits until no task is QUEUED, RUNNING or RETRYING and
// nothing is pending, and returns how long that took. On timeout it does
// not fail: the invariants report what is stuck.
func (c *cluster) waitQuiet(timeout time.Duration) (time.Duration, bool) {
	return poll(timeout, func() bool {
		return c.query(`SELECT count(*) FROM ingest_task WHERE status IN ('QUEUED', 'RUNNING', 'RETRYING')`) == 0 && c.pending() == 0
	})
}

// quietTimeout bounds the wait for quiet after a scenario.
func quietTimeout() time.Duration { return time.Duration(size(60, 300)) * time.Second }
