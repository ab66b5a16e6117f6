package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/migrations"
)

// NewPostgresServer starts a throwaway PostgreSQL cluster owned by this
// test, for tests that restart or stop it (Restart, Stop). It is stopped
// and removed when the test ends. It ignores INGEST_TEST_DATABASE_URL: a
// shared server cannot be restarted.
func NewPostgresServer(tb testing.TB) *PostgresServer {
	tb.Helper()
	s, err := StartPostgres()
	if err != nil {
		tb.Fatalf("test PostgreSQL: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// NewMigratedDatabase creates a database with every migration applied on
// the server s (see NewPostgresServer). Its pool is closed when the test
// ends; the database goes with the server.
func NewMigratedDatabase(tb testing.TB, s *PostgresServer) *Database {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgxpool.New(ctx, s.URL("postgres"))
	if err != nil {
		tb.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer admin.Close()
	name := "ingest_test_" + randomHex(6)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", name)); err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	url := s.URL(name)
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=32")
	if err != nil {
		tb.Fatalf("connect to %s: %v", name, err)
	}
	tb.Cleanup(pool.Close)
	if _, err := migrations.Up(ctx, pool); err != nil {
		tb.Fatalf("migrate %s: %v", name, err)
	}
	return &Database{Name: name, URL: url, Pool: pool}
}
