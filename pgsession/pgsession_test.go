package pgsession_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/pgsession"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestPooledTellsPgBouncerFromPostgres: the detection the binary relies on
// says yes through a transaction-pooling PgBouncer and no on a direct
// connection, on pools in pgx's default mode (it uses the simple protocol).
func TestPooledTellsPgBouncerFromPostgres(t *testing.T) {
	db := testenv.NewDatabase(t)
	bouncer := testenv.NewPgBouncer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	direct, err := pgsession.PoolPooled(ctx, db.Pool)
	if err != nil || direct {
		t.Fatalf("direct pool: Pooled = %v, %v; want false, nil", direct, err)
	}
	pool, err := pgxpool.New(ctx, bouncer.URL(t, db.URL))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for range 3 {
		pooled, err := pgsession.PoolPooled(ctx, pool)
		if err != nil || !pooled {
			t.Fatalf("pool through PgBouncer: Pooled = %v, %v; want true, nil\n%s", pooled, err, bouncer.Output())
		}
	}
}

// TestSourceConnect: the zero Source dials like the pool, Conn wins over
// the pool, None refuses with ErrNone.
func TestSourceConnect(t *testing.T) {
	db := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := (pgsession.Source{None: true}).Connect(ctx, db.Pool, "x"); !errors.Is(err, pgsession.ErrNone) {
		t.Fatalf("None: err = %v, want ErrNone", err)
	}
	conn, err := pgsession.Source{}.Connect(ctx, db.Pool, "ingest-test-session")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var name string
	if err := conn.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil || name != "ingest-test-session" {
		t.Fatalf("application_name = %q, %v", name, err)
	}
	cfg := db.Pool.Config().ConnConfig.Copy()
	cfg.Port = 1 // nothing listens there
	if _, err := (pgsession.Source{Conn: cfg, None: true}).Connect(ctx, db.Pool, "x"); err == nil || errors.Is(err, pgsession.ErrNone) {
		t.Fatalf("Conn set: err = %v, want a connection error (Conn wins over the pool and None)", err)
	}
}

// TestPoolerQueryExecModeThroughPgBouncer: eight connections through a
// transaction-pooling PgBouncer 1.18 run 400 parameterised statements in
// PoolerQueryExecMode without an error. pgx's default mode, for contrast
// (logged, not asserted: how often it breaks depends on the schedule),
// fails with "prepared statement ... already exists" or "does not exist"
// when PgBouncer hands a connection's named statements to another client.
func TestPoolerQueryExecModeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	bouncer := testenv.NewPgBouncer(t)
	run := func(mode pgx.QueryExecMode) (failed int64, first error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pc, err := pgxpool.ParseConfig(bouncer.URL(t, db.URL) + "&pool_max_conns=8")
		if err != nil {
			t.Fatal(err)
		}
		pc.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var n atomic.Int64
		var once sync.Once
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 50 {
					var sum int
					if err := pool.QueryRow(ctx, "SELECT $1::int + $2::int + count(*)::int FROM ingest_task", g, i).Scan(&sum); err != nil {
						n.Add(1)
						once.Do(func() { first = err })
					} else if sum != g+i {
						t.Errorf("%d + %d + 0 = %d", g, i, sum)
					}
				}
			})
		}
		wg.Wait()
		return n.Load(), first
	}
	if failed, first := run(pgsession.PoolerQueryExecMode); failed != 0 {
		t.Errorf("PoolerQueryExecMode through PgBouncer: %d of 400 statements failed, the first with: %v", failed, first)
	}
	failed, first := run(pgx.QueryExecModeCacheStatement)
	t.Logf("pgx's default mode through PgBouncer: %d of 400 statements failed (first: %v)", failed, first)
}

// TestRedial: pauses are jittered within half and all of a delay that
// doubles from Min to Max and starts over after Connected.
func TestRedial(t *testing.T) {
	r := pgsession.Redial{Min: 100 * time.Millisecond, Max: time.Second}
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		if want > time.Second {
			want = time.Second
		}
		if d := r.Pause(); d < want/2 || d > want {
			t.Errorf("pause %d = %s, want within [%s, %s]", i, d, want/2, want)
		}
	}
	r.Connected()
	if d := r.Pause(); d < 50*time.Millisecond || d > 100*time.Millisecond {
		t.Errorf("pause after Connected = %s, want within [50ms, 100ms]", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if pgsession.Sleep(ctx, time.Hour) {
		t.Error("Sleep with an ended context reported the pause passed")
	}
}
