package task_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// BenchmarkInsertUnnestVsCopy compares the two ways to write a batch of
// task rows in one round trip: the store's INSERT ... SELECT FROM
// unnest(arrays) RETURNING (what CreateBatch sends), and COPY of the same
// columns (pgx CopyFrom, binary), which returns nothing, so the store
// would need another statement to read back what the database fills in
// (created_at, the defaults). The store's INSERT also writes the tasks'
// audit rows, which COPY does not. Each operation writes and commits one
// batch of the given size, of 2 KB payloads:
// go test -run '^$' -bench InsertUnnestVsCopy ./task/
func BenchmarkInsertUnnestVsCopy(b *testing.B) {
	ctx := context.Background()
	db := testenv.DB(b)
	payload := `{"doc":"` + strings.Repeat("x", 2000) + `"}`
	for _, n := range []int{100, 1000, 10000} {
		rows := func() ([]uuid.UUID, []string, []string, []string) {
			ids, kinds, payloads, shas := make([]uuid.UUID, n), make([]string, n), make([]string, n), make([]string, n)
			for i := range n {
				ids[i] = uuid.Must(uuid.NewV7())
				kinds[i], payloads[i] = "bench", payload
				sum := sha256.Sum256([]byte(fmt.Sprint(i)))
				shas[i] = hex.EncodeToString(sum[:])
			}
			return ids, kinds, payloads, shas
		}
		for _, v := range []struct{ name, sql string }{
			{"unnest", task.InsertPlainSQL},
		} {
			b.Run(fmt.Sprintf("%s%d", v.name, n), func(b *testing.B) {
				for range b.N {
					b.StopTimer()
					ids, kinds, payloads, shas := rows()
					empty := make([]string, n)
					zeros32, zeros64 := make([]int32, n), make([]int64, n)
					runAt, dedup := make([]*time.Time, n), make([]bool, n)
					b.StartTimer()
					r, err := db.Query(ctx, v.sql, ids, kinds, payloads, shas, empty, zeros32, runAt, zeros64, zeros64, empty, dedup, empty, zeros64, make([]int16, len(ids)), empty, make([]bool, len(ids)))
					if err != nil {
						b.Fatal(err)
					}
					r.Close()
					if err := r.Err(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
			})
		}
		b.Run(fmt.Sprintf("copy%d", n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				ids, kinds, payloads, shas := rows()
				src := make([][]any, n)
				for i := range n {
					src[i] = []any{ids[i], kinds[i], payloads[i], shas[i]}
				}
				b.StartTimer()
				if _, err := db.CopyFrom(ctx, pgx.Identifier{"ingest_task"}, []string{"id", "kind", "payload", "payload_sha"}, pgx.CopyFromRows(src)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
