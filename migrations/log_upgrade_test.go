package migrations_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// TestUpgradeOutboxLog upgrades a database with outbox rows in every
// status to the outbox log (migration 39), and checks that outbox_event
// shows every row as it was; that log rows show NEW, then SENT with their
// entry ids once a pass has taken and recorded them; that writes through
// the view still work (an INSERT into outbox_row with the view's defaults,
// an UPDATE of a log row moving it into outbox_row, a DELETE of a log
// row); that the log's tables take outbox_row's grants; then that the
// downgrade leaves every row in outbox_row as the view showed it, and
// that the upgrade runs again.
func TestUpgradeOutboxLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const before, version = 38, 39
	db, p := migratedTo(t, before)
	exec := execer(t, db.Pool)
	exec(`GRANT SELECT, INSERT ON outbox_row TO PUBLIC`)
	create := func() uuid.UUID {
		t.Helper()
		id, err := createAsBefore(ctx, db.Pool, "log")
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	inEveryStatus(t, db.Pool, []uuid.UUID{create(), create(), create(), create()})

	rows := func(what string) []outboxEventRow { t.Helper(); return outboxEventRows(t, db.Pool, what) }
	old := rows("before the upgrade")
	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatalf("up to %d: %v", version, err)
	}
	if got := rows("after the upgrade"); !slices.Equal(got, old) {
		t.Fatalf("after the upgrade outbox_event shows\n%v\nwant\n%v", got, old)
	}
	var sel, ins bool
	if err := db.Pool.QueryRow(ctx, `SELECT has_table_privilege('public', 'outbox_log', 'SELECT'), has_table_privilege('public', 'outbox_log', 'INSERT')`).Scan(&sel, &ins); err != nil || !sel || !ins {
		t.Fatalf("PUBLIC's privileges on outbox_log: SELECT %v, INSERT %v, %v; want outbox_row's", sel, ins, err)
	}

	// Three tasks' rows in the log: NEW until a pass records them.
	logged := make([]uuid.UUID, 3)
	for i := range logged {
		logged[i] = uuid.Must(uuid.NewV7())
		exec(`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts) VALUES ($1, 'log', '{}', 'x', 3)`, logged[i])
	}
	exec(`INSERT INTO outbox_log (task_id, stream) SELECT unnest($1::uuid[]), 'ingest:tasks'`, logged)
	status := func(task uuid.UUID) (string, string) {
		t.Helper()
		var st, entry string
		if err := db.Pool.QueryRow(ctx, `SELECT status, coalesce(stream_id, '-') FROM outbox_event WHERE task_id = $1`, task).Scan(&st, &entry); err != nil {
			t.Fatal(err)
		}
		return st, entry
	}
	if st, _ := status(logged[0]); st != "NEW" {
		t.Fatalf("a log row shows %s before its publish, want NEW", st)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var taken []int64
	var lastTx string
	rs, err := tx.Query(ctx, `SELECT id, txid FROM outbox_log_take(2)`)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if _, err := pgx.ForEachRow(rs, []any{&id, &lastTx}, func() error { taken = append(taken, id); return nil }); err != nil || len(taken) != 2 {
		t.Fatalf("outbox_log_take(2): %v, %v", taken, err)
	}
	if _, err := tx.Exec(ctx, `SELECT outbox_log_record('r', $1, $2, $3, '{9-1,9-2}', '{ingest:tasks,ingest:tasks}')`, lastTx, taken[1], taken); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st, entry := status(logged[0]); st != "SENT" || entry != "9-1" {
		t.Fatalf("the first log row after its batch: %s %s, want SENT 9-1", st, entry)
	}
	if st, _ := status(logged[2]); st != "NEW" {
		t.Fatalf("the log row not taken shows %s, want NEW", st)
	}

	// Writes through the view.
	fresh := create()
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_row WHERE task_id = $1 AND status = 'NEW' AND next_retry_at <= now()`, fresh).Scan(&id); err != nil || id != 1 {
		t.Fatalf("an INSERT through the view wrote %d NEW due rows of outbox_row, %v; want 1", id, err)
	}
	var st string
	if err := db.Pool.QueryRow(ctx, `UPDATE outbox_event SET status = 'RETRYING', attempt_count = 1, last_error = 'x' WHERE task_id = $1 RETURNING status`, logged[2]).Scan(&st); err != nil || st != "RETRYING" {
		t.Fatalf("UPDATE of a log row through the view: %s, %v", st, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_log WHERE task_id = $1) + 10 * (SELECT count(*) FROM outbox_row WHERE task_id = $1 AND status = 'RETRYING')`, logged[2]).Scan(&id); err != nil || id != 10 {
		t.Fatalf("the updated log row: %d (10: moved into outbox_row), %v", id, err)
	}
	var gone uuid.UUID
	if err := db.Pool.QueryRow(ctx, `DELETE FROM outbox_event WHERE task_id = $1 RETURNING task_id`, logged[1]).Scan(&gone); err != nil || gone != logged[1] {
		t.Fatalf("DELETE of a log row through the view: %v, %v", gone, err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT id,status,attempt_count,next_retry_at,last_error,created_at,sent_at FROM outbox_event ORDER BY created_at DESC LIMIT 20`); err != nil {
		t.Fatalf("the operator's query: %v", err)
	}
	after := rows("after the writes")
	if len(after) != len(old)+3 {
		t.Fatalf("%d rows after the writes, want %d", len(after), len(old)+3)
	}

	// Down: every row in outbox_row, as the view showed it.
	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatalf("down to %d: %v", before, err)
	}
	if got := rows("after the downgrade"); !slices.Equal(got, after) {
		t.Fatalf("after the downgrade outbox_event shows\n%v\nwant\n%v", got, after)
	}
	create()
	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatalf("up to %d again: %v", version, err)
	}
	if got := rows("after the upgrade again"); len(got) != len(after)+1 {
		t.Fatalf("after the upgrade again: %d rows, want %d", len(got), len(after)+1)
	}
}

// TestUpgradeOutboxLogBaseRound: with the log's rounds emptied, migration
// 40's position is a base round and a take returns every committed row;
// its downgrade inserts that base round, so 39's position still has a
// round and its take returns them too.
func TestUpgradeOutboxLogBaseRound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := migratedTo(t, 40)
	exec := execer(t, db.Pool)
	taken := func() int {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox_log_take(100)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec(`TRUNCATE outbox_log_round`)
	exec(`INSERT INTO outbox_log (task_id, stream) SELECT gen_random_uuid(), 'ingest:tasks' FROM generate_series(1, 3)`)
	if n := taken(); n != 3 {
		t.Fatalf("at 40 with no round a take returned %d rows, want the 3 in the log", n)
	}
	exec(`TRUNCATE outbox_log_round`)
	if _, err := p.DownTo(ctx, 39); err != nil {
		t.Fatalf("down to 39: %v", err)
	}
	if n := taken(); n != 3 {
		t.Fatalf("after the downgrade from emptied rounds a take returned %d rows, want the 3 in the log", n)
	}
}
