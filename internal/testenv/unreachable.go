package testenv

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ClosedPort returns a port of 127.0.0.1 that nothing listened on a moment
// ago: the address of a server that cannot be reached.
func ClosedPort(tb testing.TB) string {
	tb.Helper()
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return strconv.Itoa(port)
}

// UnreachablePool returns a pool whose PostgreSQL cannot be reached (a
// closed port of 127.0.0.1, as the user leakuser with the password leakpw
// and the database leakdb, none of which an answer shown to a user may
// name) and that port. The pool is closed when the test ends.
func UnreachablePool(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	port := ClosedPort(tb)
	pool, err := pgxpool.New(tb.Context(), "postgres://leakuser:leakpw@127.0.0.1:"+port+"/leakdb?connect_timeout=5")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool, port
}
