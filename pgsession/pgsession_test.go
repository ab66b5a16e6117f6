package pgsession_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
