package maintenance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild()) // a leader-election process of TestLeaderProcesses
	}
	testenv.Main(m)
}

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
	if testing.Verbose() && os.Getenv("MAINTENANCE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newDedicatedRedis starts a redis-server of the test's own, and a client
// without retries.
func newDedicatedRedis(t *testing.T) (*testenv.RedisServer, *redis.Client) {
	s := testenv.NewRedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	return s, c
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

// createRows creates n tasks as create does, with their outbox rows in
// outbox_row rather than the outbox log, as the rows of released or
// redriven tasks are: for the tests of outbox_row's partitions.
func (b *bundle) createRows(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	ids := b.create(t, n)
	b.exec(t, `WITH m AS (DELETE FROM outbox_log WHERE task_id = ANY($1) RETURNING id, task_id, stream, created_at)
		INSERT INTO outbox_row (id, task_id, stream, created_at) SELECT id, task_id, stream, created_at FROM m ORDER BY id`, ids)
	return ids
}

// createAged creates n tasks as create does and moves each id an hour
// back (the time of its UUIDv7), with the rows that name it, as if the
// tasks had been created an hour ago: the rescuer reads only the tasks
// created more than its grace ago. It returns the new ids in order.
func (b *bundle) createAged(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	ids := b.create(t, n)
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The foreign keys of outbox_event and the audit table are checked by
	// triggers, which a replica session does not fire: the three tables
	// are changed in one statement.
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `
WITH m AS (
    SELECT id AS old, (lpad(to_hex(('x' || substr(replace(id::text, '-', ''), 1, 12))::bit(48)::bigint - 3600000), 12, '0')
                       || substr(replace(id::text, '-', ''), 13))::uuid AS new
    FROM ingest_task WHERE id = ANY($1)
), o AS (
    UPDATE outbox_row e SET task_id = m.new FROM m WHERE e.task_id = m.old
), l AS (
    UPDATE outbox_log e SET task_id = m.new FROM m WHERE e.task_id = m.old
), a AS (
    UPDATE ingest_task_transition r SET task_id = m.new FROM m WHERE r.task_id = m.old
)
UPDATE ingest_task t SET id = m.new FROM m WHERE t.id = m.old RETURNING m.old, m.new`, ids)
	if err != nil {
		t.Fatal(err)
	}
	moved := map[uuid.UUID]uuid.UUID{}
	for rows.Next() {
		var o, nw uuid.UUID
		if err := rows.Scan(&o, &nw); err != nil {
			t.Fatal(err)
		}
		moved[o] = nw
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	out := make([]uuid.UUID, len(ids))
	for i, id := range ids {
		if out[i] = moved[id]; out[i] == uuid.Nil {
			t.Fatalf("task %s was not moved", id)
		}
	}
	return out
}

// publishAll publishes every unsent row with one relay pass per batch.
func (b *bundle) publishAll(t *testing.T) {
	t.Helper()
	r, err := outbox.NewRelay(outbox.RelayConfig{ID: "publisher", BatchSize: 1000}, b.db, b.rdb, testLogger(t), b.reg)
	if err != nil {
		t.Fatal(err)
	}
	for {
		res, err := r.DrainOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			return
		}
	}
}

func (b *bundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.QueryRow(context.Background(), `SELECT count(*) FROM outbox_event WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
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

func slicesContains(entries map[string]string, taskID string) bool {
	for _, id := range entries {
		if id == taskID {
			return true
		}
	}
	return false
}

// entryOf returns the stream_id of a task's latest SENT outbox row.
func (b *bundle) entryOf(t *testing.T, id uuid.UUID) string {
	t.Helper()
	var sid string
	err := b.db.QueryRow(context.Background(), `SELECT stream_id FROM outbox_event
		WHERE task_id = $1 AND status = 'SENT' ORDER BY id DESC LIMIT 1`, id).Scan(&sid)
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// setState forces a task into a state, as workers would have left it.
func (b *bundle) setState(t *testing.T, id uuid.UUID, state string) {
	t.Helper()
	switch state {
	case "QUEUED":
	case "RETRYING_DUE":
		b.exec(t, `UPDATE ingest_task SET status = 'RETRYING', attempt_count = 1, next_retry_at = now() - interval '1 second' WHERE id = $1`, id)
	case "RETRYING_LATER":
		b.exec(t, `UPDATE ingest_task SET status = 'RETRYING', attempt_count = 1, next_retry_at = now() + interval '1 hour' WHERE id = $1`, id)
	case "RUNNING_EXPIRED":
		b.exec(t, `UPDATE ingest_task SET status = 'RUNNING', lease_owner = 'gone', lease_until = now() - interval '1 second' WHERE id = $1`, id)
	case "RUNNING_LIVE":
		b.exec(t, `UPDATE ingest_task SET status = 'RUNNING', lease_owner = 'alive', lease_until = now() + interval '1 hour' WHERE id = $1`, id)
	case "SUCCEEDED", "DEAD":
		// A DEAD task has a last error (ingest_task_failed_is_indexed).
		b.exec(t, `UPDATE ingest_task SET status = $2, finished_at = now(),
			last_error = CASE WHEN $2 = 'DEAD' THEN 'failed' END WHERE id = $1`, id, state)
	default:
		t.Fatalf("unknown state %s", state)
	}
}

// backdate makes every SENT row look sent an hour ago (past the grace).
func (b *bundle) backdate(t *testing.T) {
	b.exec(t, `UPDATE outbox_event SET sent_at = now() - interval '1 hour', created_at = now() - interval '1 hour' WHERE status = 'SENT'`)
}

func (b *bundle) rows(t *testing.T, id uuid.UUID) (all, unsent int) {
	return b.count(t, `task_id = $1`, id), b.count(t, `task_id = $1 AND status IN ('NEW', 'RETRYING')`, id)
}

// metricValue reads the gauge or counter name{label=value} of reg (-1:
// absent).
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if g := m.GetGauge(); g != nil {
						return g.GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}
