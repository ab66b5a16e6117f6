package task_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkGroupCycle measures one batch of 100 tasks through create,
// start and success: without groups (the default path), and with a group
// key per task whose window and limits never bind (100 groups, a window
// of 100,000), the cost of fairness configured but not binding.
func BenchmarkGroupCycle(b *testing.B) {
	for _, grouped := range []bool{false, true} {
		name := "NoGroup"
		if grouped {
			name = "GroupNotBinding"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			store, err := task.NewStore(task.Config{}, testenv.DB(b))
			if err != nil {
				b.Fatal(err)
			}
			if grouped {
				w := 100_000
				if _, err := store.SetKind(ctx, "bench", "cycle", task.KindUpdate{GroupWindow: &w}); err != nil {
					b.Fatal(err)
				}
			}
			nts := make([]task.NewTask, 100)
			b.ResetTimer()
			for i := range b.N {
				for j := range nts {
					nts[j] = task.NewTask{Kind: "cycle", Payload: json.RawMessage(`{}`)}
					if grouped {
						nts[j].GroupKey = fmt.Sprintf("tenant-%d", (i*100+j)%100)
					}
				}
				res, err := store.CreateBatch(ctx, nts)
				if err != nil {
					b.Fatal(err)
				}
				ids := make([]uuid.UUID, len(res))
				for j, r := range res {
					ids[j] = r.Task.ID
				}
				if _, err := store.Start(ctx, "w", time.Minute, ids...); err != nil {
					b.Fatal(err)
				}
				if _, err := store.Succeed(ctx, "w", ids...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
