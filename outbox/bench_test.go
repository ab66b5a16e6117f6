package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkRelayDrainOnce times one relay pass over 100 committed rows:
// the claim, the pipelined XADDs and the update marking them SENT.
func BenchmarkRelayDrainOnce(b *testing.B) {
	const n = 100
	ctx := context.Background()
	_, store, r := benchRelay(b, n)
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "bench", Payload: json.RawMessage(`{"n":1}`)}
	}
	for range b.N {
		b.StopTimer()
		if _, err := store.CreateBatch(ctx, nts); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		res, err := r.DrainOnce(ctx)
		if err != nil || res.Published != n {
			b.Fatalf("DrainOnce = %+v, %v", res, err)
		}
	}
	b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkRelayDrainDelayed times a pass over 100 delayed tasks fallen
// due: without a group, and with groups whose windows have room (the
// pass asks ingest_task_hold_due about them, which parks none): the cost
// of holding delayed tasks to their groups' windows when it does not
// bind.
func BenchmarkRelayDrainDelayed(b *testing.B) {
	for _, groups := range []int{0, 10} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			const n = 100
			ctx := context.Background()
			db, store, r := benchRelay(b, n)
			nts := make([]task.NewTask, n)
			for i := range nts {
				nts[i] = task.NewTask{Kind: "bench", Payload: json.RawMessage(`{"n":1}`), Delay: time.Millisecond}
				if groups > 0 {
					nts[i].GroupKey = fmt.Sprintf("g%d", i%groups)
				}
			}
			for range b.N {
				b.StopTimer()
				if _, err := store.CreateBatch(ctx, nts); err != nil {
					b.Fatal(err)
				}
				for notDue := 1; notDue > 0; {
					if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'NEW' AND next_retry_at > now()`).Scan(&notDue); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				res, err := r.DrainOnce(ctx)
				if err != nil || res.Published != n {
					b.Fatalf("DrainOnce = %+v, %v", res, err)
				}
				b.StopTimer()
				// Delete them, so that the windows keep room and the
				// count of a window reads no more tasks than in the first
				// round (the leader's low water would keep it so).
				if _, err := db.Exec(ctx, `DELETE FROM ingest_task`); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// benchRelay returns a fresh database, a task store on it and a relay of
// batches of n publishing to a Redis server of its own.
func benchRelay(b *testing.B, n int) (*pgxpool.Pool, *task.Store, *outbox.Relay) {
	db := testenv.DB(b)
	rdb := testenv.Client(b, testenv.NewRedisServer(b).URL())
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		b.Fatal(err)
	}
	r, err := outbox.NewRelay(outbox.RelayConfig{BatchSize: n}, db, rdb, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	return db, store, r
}
