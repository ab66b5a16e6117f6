package maintenance_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
)

// recorder records when a maintainer's services started and stopped and
// when its passes ran (the test hooks).
type recorder struct {
	mu                  sync.Mutex
	starts, stops       []time.Time
	passBegin, passEnds []time.Time
}

func (r *recorder) hooks() maintenance.Hooks {
	add := func(s *[]time.Time) func() {
		return func() {
			r.mu.Lock()
			*s = append(*s, time.Now())
			r.mu.Unlock()
		}
	}
	begin, end := add(&r.passBegin), add(&r.passEnds)
	return maintenance.Hooks{
		Started:   add(&r.starts),
		Stopped:   add(&r.stops),
		PassBegin: func(string) { begin() },
		PassEnd:   func(string) { end() },
	}
}

// times returns a copy of one of the recorder's lists.
func (r *recorder) times(s *[]time.Time) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), *s...)
}

// elected is a maintainer running in the test, with its recorder.
type elected struct {
	m      *maintenance.Maintainer
	rec    *recorder
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop cancels the maintainer and waits for Run to return nil (once).
func (e *elected) stop(t *testing.T) {
	t.Helper()
	e.once.Do(func() {
		e.cancel()
		select {
		case err := <-e.done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return within 30s of cancel")
		}
	})
}

// leaderConfig runs only retention (rows only: no Redis) every 20 ms, so
// passes are frequent and go through the maintainer's own pool.
func leaderConfig(el maintenance.ElectorConfig) maintenance.Config {
	return maintenance.Config{
		Elector:         el,
		RescuerDisabled: true, ConsumersDisabled: true,
		Retention: maintenance.RetentionConfig{Interval: 20 * time.Millisecond, DisableTrim: true},
	}
}

// startElected runs a maintainer of cfg on pool until the test ends.
func startElected(t *testing.T, cfg maintenance.Config, pool *pgxpool.Pool) *elected {
	t.Helper()
	e := &elected{rec: &recorder{}, reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	var err error
	if e.m, err = maintenance.New(cfg, pool, nil, testLogger(t), e.reg); err != nil {
		t.Fatal(err)
	}
	maintenance.SetHooks(e.m, e.rec.hooks())
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.done <- e.m.Run(ctx) }()
	t.Cleanup(func() { e.stop(t) })
	return e
}

// TestLeaderResignsOnGracefulStop: a leader that stops deletes its row, so
// a follower takes over at its next attempt, long before the lease (30 s
// here) would have expired; the leader's services stop first.
func TestLeaderResignsOnGracefulStop(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	cfg := leaderConfig(maintenance.ElectorConfig{TTL: 30 * time.Second, RetryInterval: 200 * time.Millisecond})
	a := startElected(t, cfg, db)
	testenv.Eventually(t, 10*time.Second, "a to lead", a.m.IsLeader)
	b := startElected(t, cfg, db)
	testenv.Eventually(t, 10*time.Second, "a's services to pass", func() bool { return len(a.rec.times(&a.rec.passEnds)) >= 3 })
	if b.m.IsLeader() {
		t.Fatal("b leads while a holds a live lease")
	}
	if v := metricValue(t, a.reg, "ingest_leader", "name", "maintenance"); v != 1 {
		t.Errorf("a's ingest_leader = %v, want 1", v)
	}
	if v := metricValue(t, b.reg, "ingest_leader", "name", "maintenance"); v != 0 {
		t.Errorf("b's ingest_leader = %v, want 0", v)
	}

	stoppedAt := time.Now()
	a.stop(t)
	if a.m.IsLeader() {
		t.Error("a still says it leads after Run returned")
	}
	var leader string
	err := db.QueryRow(context.Background(), `SELECT coalesce((SELECT leader_id FROM ingest_leader WHERE name = 'maintenance'), '')`).Scan(&leader)
	if err != nil {
		t.Fatal(err)
	}
	if leader == maintenance.LeaderID(a.m) {
		t.Fatalf("a's leader row is still there after a graceful stop")
	}
	testenv.Eventually(t, 5*time.Second, "b to take over", b.m.IsLeader)
	bStart := b.rec.times(&b.rec.starts)[0]
	t.Logf("takeover after a graceful stop: %s (lease 30s, follower retry 200ms)", bStart.Sub(stoppedAt).Round(time.Millisecond))
	aStops := a.rec.times(&a.rec.stops)
	if len(aStops) != 1 || !aStops[0].Before(bStart) {
		t.Fatalf("a's services stopped at %v, b's started at %v: want a stopped first", aStops, bStart)
	}
	if v := metricValue(t, a.reg, "ingest_leader", "name", "maintenance"); v != 0 {
		t.Errorf("a's ingest_leader after stopping = %v, want 0", v)
	}
}

// TestLeaderStopsWhenTheRowNamesAnother: when a renewal finds the row
// taken (here by hand), the leader stops its services at once and stays a
// follower while the other's lease lasts.
func TestLeaderStopsWhenTheRowNamesAnother(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	a := startElected(t, leaderConfig(maintenance.ElectorConfig{TTL: 1500 * time.Millisecond, RetryInterval: 50 * time.Millisecond}), db)
	testenv.Eventually(t, 10*time.Second, "a to lead", a.m.IsLeader)
	if _, err := db.Exec(context.Background(), `UPDATE ingest_leader SET leader_id = 'usurper', expires_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	taken := time.Now()
	testenv.Eventually(t, 5*time.Second, "a's services to stop", func() bool { return len(a.rec.times(&a.rec.stops)) == 1 })
	stop := a.rec.times(&a.rec.stops)[0]
	t.Logf("a stopped %s after the row was taken (renewal every 500ms)", stop.Sub(taken).Round(time.Millisecond))
	if a.m.IsLeader() {
		t.Error("a says it leads after its row was taken")
	}
	// a keeps trying (every 50 ms) but must not lead again.
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if a.m.IsLeader() || len(a.rec.times(&a.rec.starts)) != 1 {
			t.Fatal("a took the leadership back from a live lease")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLeaderStopsBeforeSuccessorStarts cuts the leader off from Postgres
// (through a TCP proxy): its connections are closed, or go silent. Either
// way its services must have stopped before the successor's start, which
// can only come after the lease expired in the database.
func TestLeaderStopsBeforeSuccessorStarts(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"ConnectionsClosed", "ConnectionsSilent"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDatabase(t)
			u, err := url.Parse(db.URL)
			if err != nil {
				t.Fatal(err)
			}
			p := newProxy(t, u.Host)
			u.Host = p.addr()
			poolA, err := pgxpool.New(context.Background(), u.String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(poolA.Close)

			// A margin of 2 s: a's own timer stops its services 2 s before
			// its lease can expire in the database, room for a stalled
			// process on a loaded machine.
			cfg := leaderConfig(maintenance.ElectorConfig{TTL: 6 * time.Second, Margin: 2 * time.Second, RetryInterval: 50 * time.Millisecond})
			a := startElected(t, cfg, poolA)
			testenv.Eventually(t, 10*time.Second, "a to lead", a.m.IsLeader)
			b := startElected(t, cfg, db.Pool)
			testenv.Eventually(t, 10*time.Second, "a's services to pass", func() bool { return len(a.rec.times(&a.rec.passEnds)) >= 3 })

			cut := time.Now()
			if mode == "ConnectionsClosed" {
				p.close()
			} else {
				p.silence()
			}
			testenv.Eventually(t, 60*time.Second, "b to take over", b.m.IsLeader)
			bStart := b.rec.times(&b.rec.starts)[0]
			aStops := a.rec.times(&a.rec.stops)
			if len(aStops) != 1 {
				t.Fatalf("a's services stopped %d times, want once", len(aStops))
			}
			t.Logf("%s: a stopped %s after the cut, b started %s after it (TTL 6s, margin 2s)", mode,
				aStops[0].Sub(cut).Round(time.Millisecond), bStart.Sub(cut).Round(time.Millisecond))
			if !aStops[0].Before(bStart) {
				t.Fatalf("b's services started at %s, before a's stopped at %s", bStart, aStops[0])
			}
			aPasses, bPasses := a.rec.times(&a.rec.passEnds), b.rec.times(&b.rec.passBegin)
			if len(aPasses) > 0 && len(bPasses) > 0 && !aPasses[len(aPasses)-1].Before(bPasses[0]) {
				t.Fatalf("a's last pass ended at %s, after b's first began at %s", aPasses[len(aPasses)-1], bPasses[0])
			}
			if a.m.IsLeader() {
				t.Fatal("a still says it leads")
			}
		})
	}
}

// proxy forwards TCP connections to a target until closed (connections
// reset, new ones refused) or silenced (connections stay open, but nothing
// passes any more, as through a dead network path).
type proxy struct {
	ln     net.Listener
	target string
	silent atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	t.Cleanup(p.close)
	go p.serve()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies from src to dst while the proxy is not silenced; then it
// keeps reading and drops what it reads.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.silent.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !p.silent.Load() {
				dst.Close()
			}
			return
		}
	}
}

// silence stops forwarding on every connection, present and future.
func (p *proxy) silence() { p.silent.Store(true) }

// close resets every connection and refuses new ones.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, as when a network path breaks
		}
		c.Close()
	}
	p.conns = nil
}
