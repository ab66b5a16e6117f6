package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkPipeline compares a fan-out/fan-in pipeline (a split, 100
// chunks that depend on it, a join that depends on every chunk, created in
// one batch) with the same 102 tasks created without dependencies, run by
// one Service end to end: from the create to the end of the last task.
// It reports tasks/s.
func BenchmarkPipeline(b *testing.B) {
	for _, deps := range []bool{false, true} {
		name := "plain"
		if deps {
			name = "fanout-fanin"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			db := testenv.NewDatabase(b)
			rdb := testenv.Client(b, testenv.NewRedisServer(b).URL())
			stream, dlq := testenv.Keys(b)
			cfg := ingest.Config{Stream: stream, DLQ: dlq, Consumer: "bench", Concurrency: 32,
				Store: task.Config{Stream: stream}, TaskLease: 30 * time.Second}
			svc, err := ingest.NewService(cfg, db.Pool, ingest.Redis(rdb), slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			ok := func(context.Context, ingest.Task) (json.RawMessage, error) {
				return json.RawMessage(`{"ok":true}`), nil
			}
			for _, k := range []string{"split", "chunk", "join"} {
				svc.HandleResult(k, ok)
			}
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- svc.Run(rctx) }()
			b.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					b.Error(err)
				}
			})
			b.ResetTimer()
			for range b.N {
				nts := []task.NewTask{{Kind: "split", Payload: json.RawMessage(`{}`), Ref: "split"}}
				refs := make([]string, 100)
				for i := range refs {
					refs[i] = fmt.Sprintf("c%d", i)
					nt := task.NewTask{Kind: "chunk", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), Ref: refs[i]}
					if deps {
						nt.DependsOnRefs = []string{"split"}
					}
					nts = append(nts, nt)
				}
				join := task.NewTask{Kind: "join", Payload: json.RawMessage(`{}`)}
				if deps {
					join.DependsOnRefs = refs
				}
				nts = append(nts, join)
				res, err := svc.Store().CreateBatch(ctx, nts)
				if err != nil {
					b.Fatal(err)
				}
				wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
				for _, r := range res {
					if t, err := svc.Wait(wctx, r.Task.ID); err != nil || t.Status != task.Succeeded {
						b.Fatalf("task %s: %s, %v", r.Task.ID, t.Status, err)
					}
				}
				wcancel()
			}
			b.ReportMetric(float64(b.N*102)/b.Elapsed().Seconds(), "tasks/s")
		})
	}
}
