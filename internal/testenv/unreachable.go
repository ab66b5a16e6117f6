package testenv

import (
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ClosedPort returns a port of 127.0.0.1 that refuses connections for the
// rest of the test: a socket bound to it without listening, held until the
// test ends, so that no other server of a parallel test can take it
// meanwhile. The port is taken below the kernel's ephemeral range
// (32768 and up on Linux), where the free ports other tests pick (the
// kernel's choice for port 0) never are, so holding it takes no port a
// parallel test is about to listen on. The address of a server that
// cannot be reached.
func ClosedPort(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatalf("closed port: socket: %v", err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if err = syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err == nil {
			return strconv.Itoa(port)
		}
	}
	tb.Fatalf("closed port: no port of 20000-31999 could be bound: %v", err)
	return ""
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
