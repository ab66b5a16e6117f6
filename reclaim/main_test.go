package reclaim_test

import (
	"os"
	"testing"

	"github.com/ingest-worker/ingest/internal/testenv"
)

// TestMain runs the tests, or, in a child process started by a test, a
// worker process (see helperMain).
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	testenv.Main(m)
}
