package task_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkCreateSequenceKeys measures what a sequence key costs a create
// (each operation: one CreateBatch of 100 tasks, committed): none, a key
// of its own per task (the key's lock and look-up, no predecessor), and
// one key for the whole batch (each task after the first follows the one
// before it: an edge, a waiting_for update and a held outbox row):
// go test -run '^$' -bench CreateSequenceKeys ./task/
func BenchmarkCreateSequenceKeys(b *testing.B) {
	ctx := context.Background()
	store, err := task.NewStore(task.Config{}, testenv.DB(b))
	if err != nil {
		b.Fatal(err)
	}
	const n = 100
	for _, mode := range []string{"none", "own-key", "one-key"} {
		b.Run(mode, func(b *testing.B) {
			for i := range b.N {
				nts := make([]task.NewTask, n)
				for j := range nts {
					nts[j] = task.NewTask{Kind: "bench", Payload: json.RawMessage(`{"doc":1}`)}
					switch mode {
					case "own-key":
						nts[j].SequenceKey = fmt.Sprintf("k-%d-%d", i, j)
					case "one-key":
						nts[j].SequenceKey = fmt.Sprintf("k-%d", i)
					}
				}
				if _, err := store.CreateBatch(ctx, nts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}
