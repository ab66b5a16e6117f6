package task_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/task"
)

// TestStartIsOneHOTUpdate: the start writes each task once, a HOT update
// (no index names a column it changes, started_from included), and
// nothing else of the task: pg_stat_xact_user_tables counts the
// transaction's own updates.
func TestStartIsOneHOTUpdate(t *testing.T) {
	b := setup(t, task.Config{})
	const n = 50
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = b.create(t, task.NewTask{}).ID
	}
	tx, err := b.db.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	rows, err := tx.Query(b.ctx, task.StartSQL, ids, "w1", int64(60000), 1024, 10)
	if err != nil {
		t.Fatal(err)
	}
	started := 0
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		// The last three columns: the state left, started, raced.
		if vals[len(vals)-2] == true && vals[len(vals)-3] == string(task.Queued) && vals[len(vals)-1] == false {
			started++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if started != n {
		t.Fatalf("started %d of %d tasks from QUEUED", started, n)
	}
	var upd, hot int64
	if err := tx.QueryRow(b.ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'ingest_task'`).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	if upd != n || hot != n {
		t.Fatalf("the start of %d tasks made %d updates, %d of them HOT; want %d and %d", n, upd, hot, n, n)
	}
}

// TestStartRecordsTheStateItReplaced: a start that waits for another
// transaction's change of its task applies its guard to the version that
// transaction committed, and its audit row names that version's state
// (the SET list reads the row it replaces), not the one its snapshot saw.
func TestStartRecordsTheStateItReplaced(t *testing.T) {
	b := setup(t, task.Config{})
	id := b.create(t, task.NewTask{}).ID
	tx, err := b.db.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	// Another transaction moves the QUEUED task to RETRYING, due at once
	// (as a hand-back does), and holds its row until it commits.
	if _, err := tx.Exec(b.ctx, `UPDATE ingest_task SET status = 'RETRYING', next_retry_at = now() WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	type res struct {
		r   []task.StartResult
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := b.store.Start(context.Background(), "w1", time.Minute, id)
		done <- res{r, err}
	}()
	// The start waits for the row: await it on pg_stat_activity.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := b.db.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the start did not wait for the row: %+v, %v", r.r, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the start never waited for the row")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.r) != 1 || r.r[0].Outcome != task.Started {
		t.Fatalf("Start = %+v, %v; want Started", r.r, r.err)
	}
	rec := b.lastTransition(t, id)
	if rec.From != string(task.Retrying) || rec.To != string(task.Running) {
		t.Fatalf("audit row %s -> %s, want RETRYING -> RUNNING", rec.From, rec.To)
	}
}

// TestAuditTriggerAnnouncesEndsOnly: the audit table has one trigger of
// its own (ingest_task_ended), a statement that ends no task (a create, a
// start) announces nothing, one that ends tasks nobody awaits announces
// nothing either, and one that ends an awaited task announces it.
func TestAuditTriggerAnnouncesEndsOnly(t *testing.T) {
	b := setup(t, task.Config{})
	var triggers []string
	rows, err := b.db.Query(b.ctx, `SELECT tgname FROM pg_trigger WHERE tgrelid = 'ingest_task_transition'::regclass AND NOT tgisinternal ORDER BY tgname`)
	if err != nil {
		t.Fatal(err)
	}
	if triggers, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(triggers, ",") != "ingest_task_ended" {
		t.Fatalf("triggers on ingest_task_transition: %v, want [ingest_task_ended]", triggers)
	}

	conn, err := b.db.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, `LISTEN `+task.DoneChannel); err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		nt, err := conn.Conn().WaitForNotification(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return nt.Payload
	}
	// A marker sent after a statement comes first if it announced nothing.
	marker := func(what string) {
		t.Helper()
		if _, err := b.db.Exec(b.ctx, `SELECT pg_notify($1, 'marker')`, task.DoneChannel); err != nil {
			t.Fatal(err)
		}
		if got := next(); got != "marker" {
			t.Fatalf("%s announced %q", what, got)
		}
	}
	id := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, id, task.Started)
	marker("a create or a start")
	unawaited := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, unawaited, task.Started)
	if _, err := b.store.Succeed(b.ctx, "w1", unawaited); err != nil {
		t.Fatal(err)
	}
	marker("the success of a task nobody awaits")
	b.await(t, id)
	if _, err := b.store.Succeed(b.ctx, "w1", id); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != id.String() {
		t.Fatalf("the success announced %q, want %s", got, id)
	}
}
