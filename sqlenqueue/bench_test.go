package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// enqueue10k is one way of creating 10,000 tasks in transaction tx.
type enqueue10k struct {
	name string
	run  func(ctx context.Context, tx pgx.Tx, store *task.Store) error
}

const benchTasks = 10_000

func benchPayload(i int) string {
	return fmt.Sprintf(`{"order_id":%d,"customer":"c-%d","lines":[1,2,3]}`, i, i%97)
}

var (
	viaCreateTx = enqueue10k{"CreateTx", func(ctx context.Context, tx pgx.Tx, store *task.Store) error {
		nts := make([]task.NewTask, benchTasks)
		for i := range nts {
			nts[i] = task.NewTask{Kind: "bench", Payload: json.RawMessage(benchPayload(i))}
		}
		_, err := store.CreateTx(ctx, tx, nts...)
		return err
	}}
	viaBatch = enqueue10k{"SQLBatch", func(ctx context.Context, tx pgx.Tx, _ *task.Store) error {
		tasks := make([]byte, 0, benchTasks*80)
		tasks = append(tasks, '[')
		for i := range benchTasks {
			if i > 0 {
				tasks = append(tasks, ',')
			}
			tasks = append(tasks, `{"kind":"bench","payload":`...)
			tasks = append(tasks, benchPayload(i)...)
			tasks = append(tasks, '}')
		}
		tasks = append(tasks, ']')
		_, err := tx.Exec(ctx, `SELECT ingest_enqueue_batch($1)`, string(tasks))
		return err
	}}
	viaCallsPipelined = enqueue10k{"SQLCallsPipelined", func(ctx context.Context, tx pgx.Tx, _ *task.Store) error {
		var batch pgx.Batch
		for i := range benchTasks {
			batch.Queue(`SELECT ingest_enqueue('bench', $1)`, benchPayload(i))
		}
		return tx.SendBatch(ctx, &batch).Close()
	}}
	viaCallsOneByOne = enqueue10k{"SQLCallsOneByOne", func(ctx context.Context, tx pgx.Tx, _ *task.Store) error {
		for i := range benchTasks {
			if _, err := tx.Exec(ctx, `SELECT ingest_enqueue('bench', $1)`, benchPayload(i)); err != nil {
				return err
			}
		}
		return nil
	}}
)

// BenchmarkEnqueue10k creates 10,000 tasks in one transaction through
// task.Store.CreateTx (the reference) and through one ingest_enqueue_batch
// call, each on a database of its own. The two take turns within every
// iteration, so a machine whose load changes slows them alike: it reports
// each one's seconds per 10,000 tasks and the batch's ratio to CreateTx.
// Run with:
//
//	go test -run '^$' -bench 'Enqueue10k$' -benchtime 10x ./sqlenqueue/
func BenchmarkEnqueue10k(b *testing.B) {
	benchmarkWays(b, viaCreateTx, viaBatch)
}

// BenchmarkEnqueue10kCalls compares 10,000 ingest_enqueue calls, sent in
// one pipeline and one round trip each (a client without pipelining),
// with CreateTx, as BenchmarkEnqueue10k does.
func BenchmarkEnqueue10kCalls(b *testing.B) {
	benchmarkWays(b, viaCreateTx, viaCallsPipelined, viaCallsOneByOne)
}

func benchmarkWays(b *testing.B, ways ...enqueue10k) {
	ctx := context.Background()
	dbs := make([]*pgxpool.Pool, len(ways))
	for i := range ways {
		dbs[i] = testenv.DB(b)
	}
	store := newStore(b, dbs[0], task.Config{})
	took := make([]time.Duration, len(ways))
	b.ResetTimer()
	for range b.N {
		for i, w := range ways {
			start := time.Now()
			tx, err := dbs[i].Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := w.run(ctx, tx, store); err != nil {
				b.Fatalf("%s: %v", w.name, err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
		}
	}
	for i, w := range ways {
		b.ReportMetric(took[i].Seconds()/float64(b.N), "s/"+w.name)
		if i > 0 {
			b.ReportMetric(float64(took[i])/float64(took[0]), "x_"+w.name)
		}
	}
}
