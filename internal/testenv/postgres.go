package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/migrations"
)

// PostgresServer is a throwaway PostgreSQL cluster started from the local
// binaries (initdb, pg_ctl), run as an unprivileged user when the tests run
// as root.
type PostgresServer = pgtemp.Server

// StartPostgres starts a new throwaway cluster; the caller stops it.
func StartPostgres() (*PostgresServer, error) {
	s, err := pgtemp.Start()
	if errors.Is(err, pgtemp.ErrNoBinaries) {
		return nil, fmt.Errorf("%w, or set INGEST_TEST_DATABASE_URL to a server the tests may create databases on", err)
	}
	return s, err
}

func freePort() (int, error) { return pgtemp.FreePort() }

// Database is a fresh, migrated database used by one test only.
type Database struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

var pg struct {
	once   sync.Once
	admin  string // URL of a database on the server to issue CREATE DATABASE from
	server *PostgresServer
	err    error
}

// adminURL returns INGEST_TEST_DATABASE_URL, or the URL of a throwaway
// server started for this test process.
func adminURL(tb testing.TB) string {
	tb.Helper()
	pg.once.Do(func() {
		if u := os.Getenv("INGEST_TEST_DATABASE_URL"); u != "" {
			pg.admin = u
			return
		}
		pg.server, pg.err = StartPostgres()
		if pg.err == nil {
			pg.admin = pg.server.URL("postgres")
			register(func() { _ = pg.server.Stop(); _ = os.RemoveAll(pg.server.Dir) })
		}
	})
	if pg.err != nil {
		tb.Fatalf("test PostgreSQL: %v", pg.err)
	}
	return pg.admin
}

// NewDatabase creates a database for this test, cloned from a template that
// has every migration applied, and drops it when the test ends.
func NewDatabase(tb testing.TB) *Database {
	tb.Helper()
	return newDatabase(tb, true)
}

// NewEmptyDatabase creates an empty database (no migrations applied) for
// this test and drops it when the test ends.
func NewEmptyDatabase(tb testing.TB) *Database {
	tb.Helper()
	return newDatabase(tb, false)
}

func newDatabase(tb testing.TB, migrated bool) *Database {
	tb.Helper()
	admin := adminURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	name := "ingest_test_" + randomHex(6)
	create := "CREATE DATABASE " + name
	if migrated {
		tmpl, err := ensureTemplate(ctx, conn, admin)
		if err != nil {
			tb.Fatalf("test database template: %v", err)
		}
		create += " TEMPLATE " + tmpl
	}
	if _, err := conn.Exec(ctx, create); err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	url, err := withDatabase(admin, name)
	if err != nil {
		tb.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=32")
	if err != nil {
		tb.Fatalf("connect to %s: %v", name, err)
	}
	tb.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
	})
	return &Database{Name: name, URL: url, Pool: pool}
}

// DB is NewDatabase(tb).Pool.
func DB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return NewDatabase(tb).Pool
}

// ensureTemplate creates (once per server and schema) a migrated template
// database, serialised across test processes by an advisory lock.
func ensureTemplate(ctx context.Context, conn *pgx.Conn, admin string) (string, error) {
	name := "ingest_tmpl_" + schemaHash()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext('ingest-worker test template'))`); err != nil {
		return "", err
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext('ingest-worker test template'))`) //nolint:errcheck
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_build"
	if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", building)); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", building)); err != nil {
		return "", err
	}
	url, err := withDatabase(admin, building)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", err
	}
	_, err = migrations.Up(ctx, pool)
	pool.Close()
	if err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name)); err != nil {
		return "", err
	}
	return name, nil
}

func schemaHash() string {
	h := sha256.New()
	files, _ := fs.Glob(migrations.Files(), "*.sql")
	sort.Strings(files)
	for _, f := range files {
		b, _ := fs.ReadFile(migrations.Files(), f)
		h.Write([]byte(f))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// withDatabase returns url with its database replaced by name.
func withDatabase(url, name string) (string, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "", fmt.Errorf("parse test database URL: %w", err)
	}
	u := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	if cfg.Password != "" {
		u = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, name)
	}
	return u, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DuringOutboxExtension runs op on a goroutine of its own while a
// transaction of db takes the locks an extension of the outbox partitions
// (outbox_event_extend) takes, in its order: SHARE on outbox_event's table
// (outbox_row), then, once a session waits for a lock of the table (op's),
// ACCESS EXCLUSIVE on its DEFAULT partition, as the attach takes it, and
// commits. It fails tb if that lock is refused (a deadlock with op) or op
// has not returned within 30 s of the commit, and returns op's error.
func DuringOutboxExtension(tb testing.TB, db *pgxpool.Pool, op func() error) error {
	tb.Helper()
	ctx := context.Background()
	ext, err := db.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = ext.Rollback(ctx) }()
	if _, err := ext.Exec(ctx, `LOCK TABLE ONLY outbox_row IN SHARE MODE`); err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- op() }()
	Eventually(tb, 30*time.Second, "a session waiting for a lock of outbox_row", func() bool {
		var waiting bool
		if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = 'outbox_row'::regclass)`).Scan(&waiting); err != nil {
			tb.Fatal(err)
		}
		return waiting
	})
	if _, err := ext.Exec(ctx, `LOCK TABLE outbox_event_default IN ACCESS EXCLUSIVE MODE`); err != nil {
		tb.Fatalf("the DEFAULT partition's lock, as an attach takes it: %v", err)
	}
	if err := ext.Commit(ctx); err != nil {
		tb.Fatal(err)
	}
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		tb.Fatal("the operation did not go on after the extension committed")
		return nil
	}
}
