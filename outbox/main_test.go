package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// bundle is what most tests need: a fresh database, a Redis client, a
// stream key of their own, a task store writing to it, and a registry.
type bundle struct {
	db     *pgxpool.Pool
	rdb    redis.UniversalClient
	stream string
	store  *task.Store
	reg    *prometheus.Registry
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return setupWith(t, testenv.Redis(t))
}

func setupWith(t *testing.T, rdb redis.UniversalClient) *bundle {
	t.Helper()
	db := testenv.DB(t)
	stream, _ := testenv.Keys(t)
	store, err := task.NewStore(task.Config{Stream: stream}, db)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, rdb: rdb, stream: stream, store: store, reg: prometheus.NewRegistry()}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() && os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func (b *bundle) relay(t *testing.T, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(cfg, b.db, b.rdb, testLogger(t), b.reg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run runs f(ctx) in a goroutine until the test ends; Run must return nil.
func run(t *testing.T, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not return within 30s of cancel")
		}
	})
}

// create creates n tasks (one transaction) and returns their ids.
func (b *bundle) create(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "test-kind", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	res, err := b.store.CreateBatch(context.Background(), nts)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, n)
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	return ids
}

// preloadSQL inserts $1 QUEUED tasks and one NEW outbox row each for
// stream $2, in one statement.
const preloadSQL = `
WITH t AS (
    INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
    SELECT gen_random_uuid(), 'bulk', jsonb_build_object('i', i), md5(i::text), 3
    FROM generate_series(1, $1) AS i
    RETURNING id
)
INSERT INTO outbox_event (task_id, stream) SELECT id, $2 FROM t`

func (b *bundle) preload(t *testing.T, n int) {
	t.Helper()
	if _, err := b.db.Exec(context.Background(), preloadSQL, n, b.stream); err != nil {
		t.Fatal(err)
	}
}

// createRows creates n tasks due now whose rows are outbox_row's, NEW, as
// a release or a redrive writes them (the rows of created tasks are the
// log's: create).
func (b *bundle) createRows(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	err := pgx.BeginFunc(ctx, b.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
			SELECT id, 'test-kind', '{}', 'sha', 3 FROM unnest($1::uuid[]) AS t(id)`, ids); err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, b.stream, ids...)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func (b *bundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) unsent(t *testing.T) int {
	return b.count(t, `status IN ('NEW', 'RETRYING')`)
}

// entries returns the task stream's entries: entry id → task_id.
func (b *bundle) entries(t *testing.T) map[string]string {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), b.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(msgs))
	for _, m := range msgs {
		out[m.ID], _ = m.Values["task_id"].(string)
	}
	return out
}

// checkPublishedOnce checks that every outbox row is SENT, that its
// stream_id is an entry of its task, and that no task has two entries.
func (b *bundle) checkPublishedOnce(t *testing.T, wantRows int) {
	t.Helper()
	entries := b.entries(t)
	perTask := map[string]int{}
	for _, id := range entries {
		perTask[id]++
	}
	for id, n := range perTask {
		if n != 1 {
			t.Errorf("task %s has %d stream entries, want 1", id, n)
		}
	}
	rows, err := b.db.Query(context.Background(), `SELECT task_id::text, status, coalesce(stream_id, '') FROM outbox_event`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var taskID, status, streamID string
		if err := rows.Scan(&taskID, &status, &streamID); err != nil {
			t.Fatal(err)
		}
		n++
		if status != "SENT" || entries[streamID] != taskID {
			t.Errorf("outbox row of task %s: status %s, stream_id %q (entry of task %q)", taskID, status, streamID, entries[streamID])
		}
	}
	if n != wantRows || len(entries) != wantRows {
		t.Errorf("%d outbox rows and %d stream entries, want %d of each", n, len(entries), wantRows)
	}
}
