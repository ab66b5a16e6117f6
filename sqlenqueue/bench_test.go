package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkEnqueue10k creates 10,000 tasks in one transaction, per
// operation: through task.Store.CreateTx (the reference), through one
// ingest_enqueue_batch call, through 10,000 ingest_enqueue calls sent in
// one pipeline, and through 10,000 ingest_enqueue calls one round trip
// each (what a client does without pipelining). Each way gets a fresh
// database. Run with: go test -run '^$' -bench Enqueue10k -benchtime 5x
// ./sqlenqueue/
func BenchmarkEnqueue10k(b *testing.B) {
	const n = 10_000
	ctx := context.Background()
	payload := func(i int) string { return fmt.Sprintf(`{"order_id":%d,"customer":"c-%d","lines":[1,2,3]}`, i, i%97) }
	inTx := func(b *testing.B, db *pgxpool.Pool, f func(tx pgx.Tx) error) {
		for range b.N {
			tx, err := db.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := f(tx); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "tasks/s")
	}
	b.Run("CreateTx", func(b *testing.B) {
		db := testenv.DB(b)
		store := newStore(b, db, task.Config{})
		inTx(b, db, func(tx pgx.Tx) error {
			nts := make([]task.NewTask, n)
			for i := range nts {
				nts[i] = task.NewTask{Kind: "bench", Payload: json.RawMessage(payload(i))}
			}
			_, err := store.CreateTx(ctx, tx, nts...)
			return err
		})
	})
	b.Run("SQLBatch", func(b *testing.B) {
		db := testenv.DB(b)
		inTx(b, db, func(tx pgx.Tx) error {
			tasks := make([]byte, 0, n*80)
			tasks = append(tasks, '[')
			for i := range n {
				if i > 0 {
					tasks = append(tasks, ',')
				}
				tasks = append(tasks, `{"kind":"bench","payload":`...)
				tasks = append(tasks, payload(i)...)
				tasks = append(tasks, '}')
			}
			tasks = append(tasks, ']')
			_, err := tx.Exec(ctx, `SELECT ingest_enqueue_batch($1)`, string(tasks))
			return err
		})
	})
	b.Run("SQLCallsPipelined", func(b *testing.B) {
		db := testenv.DB(b)
		inTx(b, db, func(tx pgx.Tx) error {
			var batch pgx.Batch
			for i := range n {
				batch.Queue(`SELECT ingest_enqueue('bench', $1)`, payload(i))
			}
			return tx.SendBatch(ctx, &batch).Close()
		})
	})
	b.Run("SQLCallsOneByOne", func(b *testing.B) {
		db := testenv.DB(b)
		inTx(b, db, func(tx pgx.Tx) error {
			for i := range n {
				if _, err := tx.Exec(ctx, `SELECT ingest_enqueue('bench', $1)`, payload(i)); err != nil {
					return err
				}
			}
			return nil
		})
	})
}
