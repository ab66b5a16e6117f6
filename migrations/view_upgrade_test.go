package migrations_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestUpgradeOutboxView upgrades a database with outbox rows in every
// status to outbox_event as a view over the table outbox_row (migration
// 38), and checks that the view shows every row as it was, takes the
// table's grants, and writes through to the table (its defaults, its
// NOTIFY trigger, UPDATE and DELETE with RETURNING); that the functions
// of the partitions read the table (its partitions, the last id taken,
// an extension that opens one); then that the downgrade leaves the table
// named outbox_event with every row, its functions working, and that the
// upgrade runs again.
func TestUpgradeOutboxView(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const before, version = 37, 38
	db, p := migratedTo(t, before)
	exec := execer(t, db.Pool)
	exec(`GRANT SELECT, INSERT ON outbox_event TO PUBLIC`)
	create := func() uuid.UUID {
		t.Helper()
		id, err := createAsBefore(ctx, db.Pool, "view")
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// NEW, RETRYING, SENT and DEAD rows.
	ids := []uuid.UUID{create(), create(), create(), create()}
	inEveryStatus(t, db.Pool, ids)

	rows := func(what string) []outboxEventRow { t.Helper(); return outboxEventRows(t, db.Pool, what) }
	relkind := func(name string) string {
		t.Helper()
		var kind string
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '-')`, name).Scan(&kind); err != nil {
			t.Fatal(err)
		}
		return kind
	}
	// functions checks the partitions' functions against the table:
	// they list its partitions, the last id is that of the newest row,
	// and an extension opens partitions past it.
	functions := func(what string) {
		t.Helper()
		var parts int
		var last, newest int64
		if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_event_partitions()), outbox_event_last_id(),
			(SELECT max(id) FROM outbox_event)`).Scan(&parts, &last, &newest); err != nil || parts < 2 || last != newest {
			t.Fatalf("%s: %d partitions, last id %d, newest row %d, %v", what, parts, last, newest, err)
		}
		var reach int64
		if err := db.Pool.QueryRow(ctx, `SELECT outbox_event_extend('1 day', '2 days', 10000), max(hi) FROM outbox_event_partitions()`).Scan(nil, &reach); err != nil || reach <= last {
			t.Fatalf("%s: the partitions reach %d, the last id %d, %v", what, reach, last, err)
		}
	}
	old := rows("before the upgrade")
	if len(old) != 4 {
		t.Fatalf("%d rows before the upgrade, want 4", len(old))
	}

	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatalf("up to %d: %v", version, err)
	}
	if v, r := relkind("outbox_event"), relkind("outbox_row"); v != "v" || r != "p" {
		t.Fatalf("after the upgrade outbox_event is %q, outbox_row %q; want a view over a partitioned table", v, r)
	}
	if got := rows("after the upgrade"); !slices.Equal(got, old) {
		t.Fatalf("after the upgrade the view shows\n%v\nwant\n%v", got, old)
	}
	var sel, ins, upd bool
	if err := db.Pool.QueryRow(ctx, `SELECT has_table_privilege('public', 'outbox_event', 'SELECT'), has_table_privilege('public', 'outbox_event', 'INSERT'),
		has_table_privilege('public', 'outbox_event', 'UPDATE')`).Scan(&sel, &ins, &upd); err != nil || !sel || !ins || upd {
		t.Fatalf("PUBLIC's privileges on the view: SELECT %v, INSERT %v, UPDATE %v, %v; want those on the table (SELECT, INSERT)", sel, ins, upd, err)
	}
	functions("after the upgrade")

	// A task's row goes through the view to the table, with the table's
	// defaults (the next id, NEW, due now) and its NOTIFY.
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN ingest_outbox`); err != nil {
		t.Fatal(err)
	}
	fresh := create()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("no notification of the row written through the view: %v", err)
	}
	var id int64
	var status, part string
	var due bool
	if err := db.Pool.QueryRow(ctx, `SELECT o.id, o.status, o.next_retry_at <= now(), r.tableoid::regclass::text
		FROM outbox_event o JOIN outbox_row r ON r.id = o.id WHERE o.task_id = $1`, fresh).Scan(&id, &status, &due, &part); err != nil ||
		id <= old[len(old)-1].ID || status != "NEW" || !due || part == "outbox_event_default" {
		t.Fatalf("the new row: id %d, %s, due %v, in %s, %v; want the next id, NEW and due, in a partition of its range", id, status, due, part, err)
	}
	if err := db.Pool.QueryRow(ctx, `UPDATE outbox_event SET status = 'SENT', stream_id = '2-0', sent_at = now() WHERE id = $1 RETURNING status`, id).Scan(&status); err != nil || status != "SENT" {
		t.Fatalf("UPDATE through the view: %s, %v", status, err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT id,status,attempt_count,next_retry_at,last_error,created_at,sent_at FROM outbox_event ORDER BY created_at DESC LIMIT 20`); err != nil {
		t.Fatalf("the operator's query: %v", err)
	}
	if err := db.Pool.QueryRow(ctx, `DELETE FROM outbox_event WHERE task_id = $1 RETURNING task_id`, ids[3]).Scan(&fresh); err != nil || fresh != ids[3] {
		t.Fatalf("DELETE through the view: %v, %v", fresh, err)
	}
	after := rows("after the writes")

	// Down: the table is outbox_event again, with every row.
	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatalf("down to %d: %v", before, err)
	}
	if v, r := relkind("outbox_event"), relkind("outbox_row"); v != "p" || r != "-" {
		t.Fatalf("after the downgrade outbox_event is %q, outbox_row %q; want the partitioned table again", v, r)
	}
	if got := rows("after the downgrade"); !slices.Equal(got, after) {
		t.Fatalf("after the downgrade the table holds\n%v\nwant\n%v", got, after)
	}
	functions("after the downgrade")
	create()

	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatalf("up to %d again: %v", version, err)
	}
	if got := rows("after the upgrade again"); len(got) != len(after)+1 {
		t.Fatalf("after the upgrade again: %d rows, want %d", len(got), len(after)+1)
	}
	functions("after the upgrade again")
}

// outboxEventRow is a row of outbox_event, every column as text where it
// may be NULL.
type outboxEventRow struct {
	ID        int64
	TaskID    uuid.UUID
	Stream    string
	Status    string
	Attempts  int
	Retry     string
	ClaimedBy string
	Until     string
	Err       string
	StreamID  string
	CreatedAt time.Time
	SentAt    string
}

// outboxEventRows reads every row of outbox_event in id order.
func outboxEventRows(t *testing.T, db *pgxpool.Pool, what string) []outboxEventRow {
	t.Helper()
	rs, err := db.Query(context.Background(), `SELECT id, task_id, stream, status, attempt_count, coalesce(next_retry_at::text, '-'),
		coalesce(claimed_by, '-'), coalesce(claimed_until::text, '-'), coalesce(last_error, '-'), coalesce(stream_id, '-'),
		created_at, coalesce(sent_at::text, '-') FROM outbox_event ORDER BY id`)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	out, err := pgx.CollectRows(rs, pgx.RowToStructByPos[outboxEventRow])
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return out
}

// inEveryStatus leaves the rows of tasks ids[1:4] RETRYING, SENT and DEAD
// (ids[0]'s stays NEW).
func inEveryStatus(t *testing.T, db *pgxpool.Pool, ids []uuid.UUID) {
	t.Helper()
	for i, q := range []string{
		`UPDATE outbox_event SET status = 'RETRYING', attempt_count = 1, last_error = 'e', next_retry_at = now() + interval '1 hour' WHERE task_id = $1`,
		`UPDATE outbox_event SET status = 'SENT', stream_id = '1-' || id, sent_at = now() WHERE task_id = $1`,
		`UPDATE outbox_event SET status = 'DEAD', attempt_count = 5, next_retry_at = NULL, last_error = 'boom' WHERE task_id = $1`,
	} {
		if _, err := db.Exec(context.Background(), q, ids[i+1]); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
