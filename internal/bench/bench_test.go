package bench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/internal/bench"
	"github.com/ingest-worker/ingest/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestRunSmoke runs the full path with 2,000 tasks in both modes: every
// task ends SUCCEEDED (Run verifies it in SQL) and the report is complete.
// Numbers are not asserted.
func TestRunSmoke(t *testing.T) {
	t.Parallel()
	for _, preload := range []bool{false, true} {
		name := "Continuous"
		if preload {
			name = "Preload"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDatabase(t)
			rdb := testenv.Client(t, testenv.NewRedisServer(t).URL())
			var progress bytes.Buffer
			rep, err := bench.Run(context.Background(), bench.Options{Tasks: 2000, Preload: preload, Concurrency: 200}, db.Pool, rdb, &progress)
			if err != nil {
				t.Fatalf("Run: %v\n%s", err, progress.String())
			}
			if rep.Succeeded != 2000 || rep.TasksPerSecond <= 0 || rep.InsertPerSecond <= 0 {
				t.Errorf("report %+v", rep)
			}
			if rep.LatencyMS.Start.Count != 2000 || rep.LatencyMS.Done.Count != 2000 {
				t.Errorf("latency samples: start %d, done %d, want 2000 each", rep.LatencyMS.Start.Count, rep.LatencyMS.Done.Count)
			}
			if rep.SQLStatements == 0 || rep.RedisRoundTrips == 0 || rep.PeakRSSMiB <= 0 {
				t.Errorf("counters not collected: %+v", rep)
			}
			var out bytes.Buffer
			bench.Print(&out, rep)
			for _, want := range []string{"tasks/s worked", "commit→SUCCEEDED", "SQL statements/task", "peak RSS"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
