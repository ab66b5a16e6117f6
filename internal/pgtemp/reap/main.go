// Command reap stops and removes the throwaway PostgreSQL clusters whose
// owning process died without closing them (pgtemp.ReapOrphans, as every
// start of a cluster does first). .ci/run runs it when CI ends, passed or
// failed, so that a test binary killed by go test's -timeout or a panic
// leaves no server running.
package main

import (
	"fmt"
	"os"

	"github.com/ingest-worker/ingest/internal/pgtemp"
)

func main() {
	n, err := pgtemp.ReapOrphans()
	if n > 0 {
		fmt.Printf("reaped %d orphaned PostgreSQL cluster(s)\n", n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "reap:", err)
		os.Exit(1)
	}
}
