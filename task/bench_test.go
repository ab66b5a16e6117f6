package task_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkHotStatements times the statements of the hot path, 100 tasks
// per operation (one round trip each, except CreateBatch: one transaction
// of three inserts): run with -bench HotStatements -benchtime 200x.
func BenchmarkHotStatements(b *testing.B) {
	const n = 100
	ctx := context.Background()
	store, err := task.NewStore(task.Config{}, testenv.DB(b))
	if err != nil {
		b.Fatal(err)
	}
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "bench", Payload: json.RawMessage(`{"n":1}`)}
	}
	create := func(b *testing.B) []uuid.UUID {
		res, err := store.CreateBatch(ctx, nts)
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]uuid.UUID, n)
		for i, r := range res {
			ids[i] = r.Task.ID
		}
		return ids
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "tasks/s")
	}
	b.Run("CreateBatch100", func(b *testing.B) {
		for range b.N {
			create(b)
		}
		report(b)
	})
	b.Run("Start100", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			ids := create(b)
			b.StartTimer()
			if _, err := store.Start(ctx, "w", time.Minute, ids...); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("Succeed100", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			ids := create(b)
			if _, err := store.Start(ctx, "w", time.Minute, ids...); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := store.Succeed(ctx, "w", ids...); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("SucceedWithResults100", func(b *testing.B) {
		succ := make([]task.Success, n)
		for range b.N {
			b.StopTimer()
			ids := create(b)
			if _, err := store.Start(ctx, "w", time.Minute, ids...); err != nil {
				b.Fatal(err)
			}
			for i, id := range ids {
				succ[i] = task.Success{ID: id, Result: json.RawMessage(`{"pages":12,"title":"annual report"}`)}
			}
			b.StartTimer()
			if _, err := store.SucceedWith(ctx, "w", succ...); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("Fail100", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			ids := create(b)
			if _, err := store.Start(ctx, "w", time.Minute, ids...); err != nil {
				b.Fatal(err)
			}
			fs := make([]task.Failure, n)
			for i, id := range ids {
				fs[i] = task.Failure{ID: id, Error: "boom"}
			}
			b.StartTimer()
			if _, err := store.Fail(ctx, "w", fs...); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
}
