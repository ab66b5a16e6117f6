package maintenance_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
)

// The child processes of TestLeaderProcesses are this test binary, run
// again with childEnv set to the child's name (see TestMain).
const (
	childEnv      = "MAINTENANCE_TEST_CHILD"
	childDBEnv    = "MAINTENANCE_TEST_CHILD_DATABASE_URL"
	childRedisEnv = "MAINTENANCE_TEST_CHILD_REDIS_URL"
)

// runChild runs a Maintainer with the default election settings and the
// rescuer every 50 ms until SIGTERM, and prints one line per event to
// stdout: "<event> <unix ns>", event being started, stopped (its services,
// under a leadership), pass-begin, pass-end (of the rescuer), exited.
func runChild() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, os.Getenv(childDBEnv))
	if err != nil {
		logger.Error("child: connect to Postgres", "err", err)
		return 1
	}
	defer pool.Close()
	opt, err := redis.ParseURL(os.Getenv(childRedisEnv))
	if err != nil {
		logger.Error("child: parse Redis URL", "err", err)
		return 1
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	m, err := maintenance.New(maintenance.Config{
		Elector:           maintenance.ElectorConfig{ID: os.Getenv(childEnv)},
		Rescuer:           maintenance.RescuerConfig{Interval: 50 * time.Millisecond},
		RetentionDisabled: true,
		ReleaserDisabled:  true,
		ConsumersDisabled: true,
	}, pool, rdb, logger, nil)
	if err != nil {
		logger.Error("child: maintenance.New", "err", err)
		return 1
	}
	var mu sync.Mutex
	emit := func(event string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, "%s %d\n", event, time.Now().UnixNano())
	}
	maintenance.SetHooks(m, maintenance.Hooks{
		Started: func() { emit("started") },
		Stopped: func() { emit("stopped") },
		// The rescuer's passes alone: the services that run beside it
		// (the low water, partitions, ...) have passes of their own, which
		// overlap its passes in one process and would pair with them.
		PassBegin: func(s string) {
			if s == maintenance.RescuerService {
				emit("pass-begin")
			}
		},
		PassEnd: func(s string) {
			if s == maintenance.RescuerService {
				emit("pass-end")
			}
		},
	})
	if err := m.Run(ctx); err != nil {
		logger.Error("child: Run", "err", err)
		return 1
	}
	emit("exited")
	return 0
}

// child is one process of TestLeaderProcesses and the events it printed.
type child struct {
	name   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	events map[string][]time.Time
	stderr bytes.Buffer  // guarded by mu (written by exec's copier)
	read   chan struct{} // closed when stdout is read to the end
	killed time.Time     // when it was SIGKILLed (zero: it was not)
}

func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.Write(p)
}

func (c *child) times(event string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.events[event]...)
}

func startChild(t *testing.T, name, dbURL, redisURL string) *child {
	t.Helper()
	c := &child{name: name, events: map[string][]time.Time{}, read: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0])
	c.cmd.Env = append(os.Environ(), childEnv+"="+name, childDBEnv+"="+dbURL, childRedisEnv+"="+redisURL)
	c.cmd.Stderr = c
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.read)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			event, ns, ok := strings.Cut(sc.Text(), " ")
			n, err := strconv.ParseInt(ns, 10, 64)
			if !ok || err != nil {
				continue
			}
			c.mu.Lock()
			c.events[event] = append(c.events[event], time.Unix(0, n))
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			<-c.read
			_ = c.cmd.Wait()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if s := c.stderr.String(); s != "" && (t.Failed() || testing.Verbose()) {
			t.Logf("%s stderr:\n%s", c.name, s)
		}
	})
	return c
}

// kill SIGKILLs the child and waits for it.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.killed = time.Now() // it died before this
	<-c.read
	_ = c.cmd.Wait()
}

// terminate SIGTERMs the child and waits for it to exit 0.
func (c *child) terminate(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-c.read
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("%s exited with %v after SIGTERM", c.name, err)
	}
	if len(c.times("exited")) != 1 {
		t.Fatalf("%s did not return from Run after SIGTERM", c.name)
	}
	return at
}

// intervals returns the child's [begin, end] intervals of two paired
// events; one left open ends when the child was killed.
func (c *child) intervals(begin, end string) [][2]time.Time {
	bs, es := c.times(begin), c.times(end)
	var out [][2]time.Time
	for i, b := range bs {
		e := c.killed
		if i < len(es) {
			e = es[i]
		}
		out = append(out, [2]time.Time{b, e})
	}
	return out
}

// leaders returns the children whose services run now (started more
// often than stopped, and not killed).
func leaders(cs []*child) []*child {
	var out []*child
	for _, c := range cs {
		if c.killed.IsZero() && c.cmd.ProcessState == nil && len(c.times("started")) > len(c.times("stopped")) {
			out = append(out, c)
		}
	}
	return out
}

// TestLeaderProcesses runs three processes with the default election
// settings (TTL 3 s, renewal every 1 s, followers every 1 s) and only the
// rescuer: exactly one runs it at a time; SIGKILL the leader and another
// leads once its lease has run out (2 to 4 s, logged); SIGTERM that one and
// the third takes over at its next attempt. Leaderships and rescuer passes
// of different processes never overlap.
func TestLeaderProcesses(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	rs := testenv.NewRedisServer(t)
	var cs []*child
	for _, name := range []string{"p1", "p2", "p3"} {
		cs = append(cs, startChild(t, name, db.URL, rs.URL()))
	}
	passes := func(c *child) int { return len(c.times("pass-end")) }

	testenv.Eventually(t, 30*time.Second, "a leader", func() bool { return len(leaders(cs)) == 1 })
	first := leaders(cs)[0]
	testenv.Eventually(t, 10*time.Second, "5 rescuer passes of the leader", func() bool { return passes(first) >= 5 })
	for _, c := range cs {
		if c != first && (passes(c) != 0 || len(c.times("started")) != 0) {
			t.Fatalf("%s ran %d passes while %s led", c.name, passes(c), first.name)
		}
	}

	first.kill(t)
	// A lease of 3 s renewed every second: a new leader within 2 to 4 s
	// (logged; the deadline only bounds a hang).
	testenv.Eventually(t, 40*time.Second, "a new leader after SIGKILL", func() bool { return len(leaders(cs)) == 1 })
	second := leaders(cs)[0]
	failover := second.times("started")[0].Sub(first.killed)
	t.Logf("failover after SIGKILL of the leader %s: %s to %s (%d passes before)", first.name, failover.Round(time.Millisecond), second.name, passes(first))
	testenv.Eventually(t, 10*time.Second, "passes of the new leader", func() bool { return passes(second) >= 3 })

	termAt := second.terminate(t)
	testenv.Eventually(t, 40*time.Second, "the last process to lead", func() bool { return len(leaders(cs)) == 1 })
	third := leaders(cs)[0]
	takeover := third.times("started")[0].Sub(termAt)
	t.Logf("takeover after SIGTERM of the leader %s: %s to %s", second.name, takeover.Round(time.Millisecond), third.name)
	testenv.Eventually(t, 10*time.Second, "passes of the last leader", func() bool { return passes(third) >= 3 })
	third.terminate(t)

	// No two processes ever led, or ran a pass, at the same time.
	for _, ev := range [][2]string{{"started", "stopped"}, {"pass-begin", "pass-end"}} {
		type span struct {
			who        string
			begin, end time.Time
		}
		var spans []span
		for _, c := range cs {
			for _, iv := range c.intervals(ev[0], ev[1]) {
				if iv[1].IsZero() {
					t.Fatalf("%s: a %s without %s", c.name, ev[0], ev[1])
				}
				spans = append(spans, span{c.name, iv[0], iv[1]})
			}
		}
		slices.SortFunc(spans, func(a, b span) int { return a.begin.Compare(b.begin) })
		for i := 1; i < len(spans); i++ {
			if p, s := spans[i-1], spans[i]; s.begin.Before(p.end) {
				t.Errorf("%s of %s at %s overlaps the one of %s ending at %s", ev[0], s.who, s.begin.Format(time.StampMicro), p.who, p.end.Format(time.StampMicro))
			}
		}
	}
	total := 0
	for _, c := range cs {
		total += passes(c)
	}
	t.Logf("rescuer passes per process: %s %d, %s %d, %s %d (total %d)", cs[0].name, passes(cs[0]), cs[1].name, passes(cs[1]), cs[2].name, passes(cs[2]), total)
}
