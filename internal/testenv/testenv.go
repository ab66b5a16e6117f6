// Package testenv provides the real servers every test suite of this
// repository runs against: PostgreSQL and redis-server.
//
// A URL in INGEST_TEST_DATABASE_URL / INGEST_TEST_REDIS_URL is used when set;
// otherwise a throwaway server is started from the local binaries (initdb and
// pg_ctl, run as the user nobody when the tests run as root; redis-server) and
// stopped when the test binary exits. A missing binary fails the test with a
// message that says what to install: a silently skipped suite is no pass.
//
// Each test gets a database of its own (cloned from a migrated template) and
// its own Redis keys, so tests and packages run in parallel.
//
// It also owns what tests share across a test process besides the servers:
// a command's binary built once (Binary), and the repository's Node.js and
// Python test tools (NodeBin, Python3).
package testenv

import (
	"os"
	"sync"
	"testing"
	"time"
)

var cleanup struct {
	mu  sync.Mutex
	fns []func()
}

func register(f func()) {
	cleanup.mu.Lock()
	defer cleanup.mu.Unlock()
	cleanup.fns = append(cleanup.fns, f)
}

// Main runs the tests and then stops the servers this process started. Call
// it from TestMain: func TestMain(m *testing.M) { testenv.Main(m) }.
func Main(m *testing.M) { MainWith(m, nil) }

// MainWith is Main with after run once the tests have finished, before the
// servers stop (for example to print a report).
func MainWith(m *testing.M, after func()) {
	code := m.Run()
	if after != nil {
		after()
	}
	cleanup.mu.Lock()
	for i := len(cleanup.fns) - 1; i >= 0; i-- {
		cleanup.fns[i]()
	}
	cleanup.mu.Unlock()
	os.Exit(code)
}

// Eventually polls cond until it holds, and fails the test if timeout
// passes first, naming what it waited for. It polls after 1 ms, then at
// doubling intervals up to 50 ms: quick conditions are seen at once, slow
// ones (a subprocess, a cluster) are not hammered.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	poll := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(poll)
		poll = min(2*poll, 50*time.Millisecond)
	}
}
