package sqlenqueue_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestLimitsMatchGo holds the SQL's one copy of the field limits, and the
// functions' default settings, to package task's constants.
func TestLimitsMatchGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	var got map[string]int64
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue_limits()`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"max_kind_bytes":            task.MaxKindLength,
		"max_idempotency_key_bytes": task.MaxIdempotencyKeyLength,
		"max_attempts_min":          task.MaxAttemptsRange.Min,
		"max_attempts_max":          task.MaxAttemptsRange.Max,
		"max_delay_ms":              task.DelayRange.Max,
		"max_timeout_ms":            task.TimeoutRange.Max,
		"schedule_horizon_days":     int64(task.ScheduleHorizon.Hours() / 24),
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("ingest_enqueue_limits() %s = %d; Go has %d", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("ingest_enqueue_limits() = %v; want the keys of %v", got, want)
	}
	if task.DelayRange.Min != 0 || task.TimeoutRange.Min != 0 {
		t.Errorf("delay_ms and timeout_ms start at 0 in SQL; Go has %d and %d", task.DelayRange.Min, task.TimeoutRange.Min)
	}
	var cfg []string
	if err := db.QueryRow(ctx, `SELECT proconfig FROM pg_proc WHERE oid = 'ingest_enqueue_batch(jsonb)'::regprocedure`).Scan(&cfg); err != nil {
		t.Fatal(err)
	}
	settings := map[string]bool{}
	for _, c := range cfg {
		settings[c] = true
	}
	for _, s := range []string{"ingest.stream=" + task.DefaultStream, "ingest.max_payload_bytes=" + strconv.Itoa(task.DefaultMaxPayloadBytes)} {
		if !settings[s] {
			t.Errorf("ingest_enqueue_batch's settings %v lack the default %s", cfg, s)
		}
	}
}

// TestProducerRole: a role granted EXECUTE on the two functions (the
// grants of docs/SQL-ENQUEUE.md) enqueues, in a transaction of its own,
// and can do nothing else: no table, no helper function, no setting of
// the functions; a role without the grant cannot enqueue.
func TestProducerRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := testenv.NewDatabase(t)
	db := d.Pool
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	producer, other := "producer_"+hex.EncodeToString(suffix), "stranger_"+hex.EncodeToString(suffix)
	for _, role := range []string{producer, other} {
		if _, err := db.Exec(ctx, `CREATE ROLE `+role+` LOGIN PASSWORD 'secret-for-test'`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = db.Exec(context.Background(), `DROP OWNED BY `+role)
			_, _ = db.Exec(context.Background(), `DROP ROLE `+role)
		})
	}
	if _, err := db.Exec(ctx, `GRANT EXECUTE ON FUNCTION ingest_enqueue(text, jsonb, jsonb), ingest_enqueue_batch(jsonb) TO `+producer); err != nil {
		t.Fatal(err)
	}
	connect := func(role string) *pgx.Conn {
		cfg, err := pgx.ParseConfig(d.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Password = role, "secret-for-test"
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}

	conn := connect(producer)
	// A session setting does not move the outbox rows: the function's own
	// settings win.
	if _, err := conn.Exec(ctx, `SET ingest.stream = 'elsewhere'`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT ingest_enqueue('k', '{"n":1}', '{"max_attempts":2}')`); err != nil {
		t.Fatalf("producer ingest_enqueue: %v", err)
	}
	if _, err := tx.Exec(ctx, `SELECT ingest_enqueue_batch('[{"kind":"k","payload":2},{"kind":"k","payload":3}]')`); err != nil {
		t.Fatalf("producer ingest_enqueue_batch: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var tasks, outbox int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM ingest_task),
		(SELECT count(*) FROM outbox_event WHERE stream = $1)`, task.DefaultStream).Scan(&tasks, &outbox); err != nil || tasks != 3 || outbox != 3 {
		t.Errorf("%d tasks, %d outbox rows on %s, %v; want 3 and 3", tasks, outbox, task.DefaultStream, err)
	}

	denied := []string{
		`SELECT count(*) FROM ingest_task`,
		`UPDATE ingest_task SET status = 'DEAD'`,
		`DELETE FROM outbox_event`,
		`INSERT INTO ingest_task_transition (task_id, to_status) VALUES (gen_random_uuid(), 'QUEUED')`,
		`SELECT ingest_enqueue_tasks('[]', false)`,
		`SELECT ingest_canonical_json('{}')`,
		`ALTER FUNCTION ingest_enqueue_batch(jsonb) SET ingest.stream = 'elsewhere'`,
	}
	for _, sql := range denied {
		if _, err := conn.Exec(ctx, sql); err == nil || pgError(t, err).Code != "42501" {
			t.Errorf("producer: %s = %v; want insufficient_privilege (42501)", sql, err)
		}
	}
	if _, err := connect(other).Exec(ctx, `SELECT ingest_enqueue('k', '{}')`); err == nil || pgError(t, err).Code != "42501" {
		t.Errorf("a role without the grant: ingest_enqueue = %v; want insufficient_privilege (42501)", err)
	}
}
