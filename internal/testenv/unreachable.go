package testenv

import (
	"strconv"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ClosedPort returns a port of 127.0.0.1 that refuses connections for the
// rest of the test: a socket bound to it without listening, held until the
// test ends, so that no other server of a parallel test (nor the kernel,
// as an ephemeral port) can take it meanwhile. The address of a server
// that cannot be reached.
func ClosedPort(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatalf("closed port: socket: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("closed port: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("closed port: getsockname: %v", err)
	}
	return strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
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
