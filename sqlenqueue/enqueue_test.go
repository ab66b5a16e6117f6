package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/sqlenqueue"
	"github.com/ingest-worker/ingest/task"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// useStream points the functions' outbox rows at stream, as an operator
// does.
func useStream(t testing.TB, db *pgxpool.Pool, stream string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), fmt.Sprintf(`ALTER FUNCTION ingest_enqueue_batch(jsonb) SET ingest.stream = %s`,
		quote(stream))); err != nil {
		t.Fatal(err)
	}
}

// storeOn returns a test database whose SQL create publishes to stream
// (useStream) and a Go store on it publishing to the same stream, so that
// the two paths' outbox rows compare.
func storeOn(t *testing.T, stream string) (*pgxpool.Pool, *task.Store) {
	t.Helper()
	db := testenv.DB(t)
	useStream(t, db, stream)
	return db, newStore(t, db, task.Config{Stream: stream})
}

// newStore returns a task store of cfg on db.
func newStore(tb testing.TB, db *pgxpool.Pool, cfg task.Config) *task.Store {
	tb.Helper()
	store, err := task.NewStore(cfg, db)
	if err != nil {
		tb.Fatal(err)
	}
	return store
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// rows returns what a task's creation wrote, without what differs between
// any two creations (ids, times): the task row, its audit rows and its
// outbox rows as JSON objects.
func rows(t *testing.T, db *pgxpool.Pool, id uuid.UUID) (taskRow string, audit, outbox []string) {
	t.Helper()
	ctx := context.Background()
	if err := db.QueryRow(ctx, `SELECT (to_jsonb(t) - 'id' - 'created_at' - 'updated_at' - 'next_retry_at' - 'due_at'
		|| jsonb_build_object('delayed', next_retry_at IS NOT NULL, 'due_is_next', due_at IS NOT DISTINCT FROM next_retry_at))::text
		FROM ingest_task t WHERE id = $1`, id).Scan(&taskRow); err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	var err error
	audit, err = texts(db, `SELECT (to_jsonb(a) - 'id' - 'task_id' - 'created_at')::text FROM ingest_task_transition a WHERE task_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	outbox, err = texts(db, `SELECT (to_jsonb(o) - 'id' - 'task_id' - 'created_at' - 'next_retry_at'
		|| jsonb_build_object('due_with_task', o.next_retry_at = coalesce(t.next_retry_at, o.created_at)))::text
		FROM outbox_event o JOIN ingest_task t ON t.id = o.task_id WHERE task_id = $1 ORDER BY o.id`, id)
	if err != nil {
		t.Fatal(err)
	}
	return taskRow, audit, outbox
}

func texts(db *pgxpool.Pool, sql string, args ...any) ([]string, error) {
	r, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(r, pgx.RowTo[string])
}

// TestRowsMatchCreateTx creates the same tasks through CreateTx and through
// ingest_enqueue, each option alone and all together, and finds the same
// task row (payload_sha included), audit row and outbox row.
func TestRowsMatchCreateTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := storeOn(t, "s:match")
	runAt := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	// Keys Go sorts by bytes, escapes Go writes, nesting, numbers as jsonb
	// keeps them.
	payload := `{"b":[1,2.50,{"z":null,"A":true}],"a":"x\u2028y\u2029\"\\\n\t\u0001<>&é😀","aa":{},"é":[],"B":-0.001}`
	cases := []struct {
		name string
		nt   task.NewTask
		opts string
	}{
		{"plain", task.NewTask{}, `{}`},
		{"idempotency_key", task.NewTask{IdempotencyKey: "key-1"}, `{"idempotency_key":"key-1"}`},
		{"max_attempts", task.NewTask{MaxAttempts: 7}, `{"max_attempts":7}`},
		{"run_at", task.NewTask{RunAt: runAt}, fmt.Sprintf(`{"run_at":%q}`, runAt.Format(time.RFC3339Nano))},
		{"run_at_past", task.NewTask{RunAt: time.Now().Add(-time.Hour)}, fmt.Sprintf(`{"run_at":%q}`, time.Now().Add(-time.Hour).Format(time.RFC3339))},
		{"delay_ms", task.NewTask{Delay: time.Minute}, `{"delay_ms":60000}`},
		{"timeout_ms", task.NewTask{Timeout: 1500 * time.Millisecond}, `{"timeout_ms":1500}`},
		{"traceparent", task.NewTask{Traceparent: tp}, fmt.Sprintf(`{"traceparent":%q}`, tp)},
		{"dedup_by_payload", task.NewTask{DedupByPayload: true}, `{"dedup_by_payload":true}`},
		{"priority", task.NewTask{Priority: 1}, `{"priority":1}`},
		{"priority_lowest", task.NewTask{Priority: 4}, `{"priority":4}`},
		{"priority_default", task.NewTask{Priority: 2}, `{"priority":2}`},
		{"group_key", task.NewTask{GroupKey: "acme é"}, `{"group_key":"acme é"}`},
		{"all", task.NewTask{IdempotencyKey: "key-2", MaxAttempts: 3, Delay: time.Second, Timeout: time.Second, Traceparent: tp, Priority: 3, GroupKey: "acme"},
			fmt.Sprintf(`{"idempotency_key":"key-2","max_attempts":3,"delay_ms":1000,"timeout_ms":1000,"traceparent":%q,"priority":3,"group_key":"acme"}`, tp)},
		{"nulls_are_absent", task.NewTask{}, `{"idempotency_key":null,"max_attempts":null,"run_at":null,"delay_ms":null,"timeout_ms":null,"traceparent":null,"dedup_by_payload":null,"priority":null,"group_key":null}`},
	}
	for _, tc := range cases {
		// One kind per creation path, so keys and dedup do not meet.
		nt := tc.nt
		nt.Kind, nt.Payload = "go-"+tc.name, json.RawMessage(payload)
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.CreateTx(ctx, tx, nt)
		if err != nil {
			t.Fatalf("%s: CreateTx: %v", tc.name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		var id uuid.UUID
		if err := db.QueryRow(ctx, `SELECT ingest_enqueue($1, $2, $3)`, " sql-"+tc.name+"\n", payload, tc.opts).Scan(&id); err != nil {
			t.Fatalf("%s: ingest_enqueue: %v", tc.name, err)
		}
		if id.Version() != 7 {
			t.Errorf("%s: id %s is a UUIDv%d, want v7 as Go makes them", tc.name, id, id.Version())
		}
		goTask, goAudit, goOutbox := rows(t, db, res[0].Task.ID)
		sqlTask, sqlAudit, sqlOutbox := rows(t, db, id)
		sqlTask = strings.Replace(sqlTask, `"sql-`+tc.name+`"`, `"go-`+tc.name+`"`, 1)
		if goTask != sqlTask {
			t.Errorf("%s: task row\n go: %s\nsql: %s", tc.name, goTask, sqlTask)
		}
		if fmt.Sprint(goAudit) != fmt.Sprint(sqlAudit) {
			t.Errorf("%s: audit rows\n go: %s\nsql: %s", tc.name, goAudit, sqlAudit)
		}
		if fmt.Sprint(goOutbox) != fmt.Sprint(sqlOutbox) {
			t.Errorf("%s: outbox rows\n go: %s\nsql: %s", tc.name, goOutbox, sqlOutbox)
		}
	}
}

// TestRepeatsReturnTheExistingTask: an idempotency key or a payload dedup
// that matches a task (created by Go or by SQL, before or earlier in the
// batch) gives that task's id and creates nothing.
func TestRepeatsReturnTheExistingTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	store := newStore(t, db, task.Config{})
	goKeyed, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"n":1}`), IdempotencyKey: "go"})
	if err != nil {
		t.Fatal(err)
	}
	goDedup, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{ "n": 2, "m": [1] }`), DedupByPayload: true})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue_batch($1)`, `[
		{"kind":"k","payload":{"other":1},"idempotency_key":"go"},
		{"kind":"k","payload":{"m":[1],"n":2},"dedup_by_payload":true},
		{"kind":"k","payload":1,"idempotency_key":"sql"},
		{"kind":"k","payload":2,"idempotency_key":"sql"},
		{"kind":"k","payload":[3],"dedup_by_payload":true},
		{"kind":"k","payload":[3],"dedup_by_payload":true},
		{"kind":"k","payload":[3]}
	]`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 7 {
		t.Fatalf("%d ids for 7 tasks", len(ids))
	}
	if ids[0] != goKeyed.Task.ID || ids[1] != goDedup.Task.ID {
		t.Errorf("ids %s, %s; want the Go-created tasks %s, %s", ids[0], ids[1], goKeyed.Task.ID, goDedup.Task.ID)
	}
	if ids[3] != ids[2] || ids[5] != ids[4] || ids[6] == ids[4] {
		t.Errorf("batch repeats: %v; want [3]=[2], [5]=[4], [6] new", ids)
	}
	var again uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue('k', '"x"', '{"idempotency_key":"sql"}')`).Scan(&again); err != nil || again != ids[2] {
		t.Errorf("repeat of key sql = %s, %v; want %s", again, err, ids[2])
	}
	goRepeat, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`[3]`), DedupByPayload: true})
	if err != nil || goRepeat.Task.ID != ids[4] || !goRepeat.Existing {
		t.Errorf("Go dedup create of an SQL-created task = %+v, %v; want existing %s", goRepeat, err, ids[4])
	}
	var tasks, audits, outbox int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM ingest_task), (SELECT count(*) FROM ingest_task_transition),
		(SELECT count(*) FROM outbox_event)`).Scan(&tasks, &audits, &outbox); err != nil {
		t.Fatal(err)
	}
	if tasks != 5 || audits != 5 || outbox != 5 {
		t.Errorf("%d tasks, %d audit rows, %d outbox rows; want 5 of each (2 by Go, 3 by SQL)", tasks, audits, outbox)
	}
}

// TestBatchInOneTransaction: ids come back in the order of the tasks, and
// a rolled back transaction leaves no row.
func TestBatchInOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	if err := tx.QueryRow(ctx, `SELECT ingest_enqueue_batch(jsonb_agg(jsonb_build_object('kind', 'k', 'payload', i) ORDER BY i))
		FROM generate_series(1, 100) i`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		var p int
		if err := tx.QueryRow(ctx, `SELECT payload::int FROM ingest_task WHERE id = $1`, id).Scan(&p); err != nil || p != i+1 {
			t.Fatalf("id %d has payload %d, %v; want %d", i, p, err, i+1)
		}
	}
	var empty []uuid.UUID
	if err := tx.QueryRow(ctx, `SELECT ingest_enqueue_batch('[]')`).Scan(&empty); err != nil || len(empty) != 0 {
		t.Errorf("empty batch = %v, %v; want no ids", empty, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertNothingWritten(t, db)
}

func assertNothingWritten(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM ingest_task) + (SELECT count(*) FROM ingest_task_transition)
		+ (SELECT count(*) FROM outbox_event)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows written; want none", n)
	}
}

// pgError returns err's *pgconn.PgError, failing the test without one.
func pgError(t *testing.T, err error) *pgconn.PgError {
	t.Helper()
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		t.Fatalf("error %v is no PostgreSQL error", err)
	}
	return pg
}

var _ = sqlenqueue.Options
