package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/sqlenqueue"
	"github.com/ingest-worker/ingest/task"
)

// TestSequenceKey: ingest_enqueue and ingest_enqueue_batch take
// sequence_key as the Go store does: tasks created from Go and from SQL
// with one kind and key form one line (numbered in creation order, each
// held behind the one before, its outbox row not due), items of a batch
// in batch order; a bad key is refused naming sequence_key, writing
// nothing.
func TestSequenceKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	store := newStore(t, db, task.Config{})
	first, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), SequenceKey: "doc"})
	if err != nil {
		t.Fatal(err)
	}
	var second uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue('k', '2', '{"sequence_key":"doc"}')`).Scan(&second); err != nil {
		t.Fatal(err)
	}
	var batch []uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue_batch('[{"kind":"k","payload":3,"sequence_key":"doc"},{"kind":"k","payload":1,"sequence_key":"other"},{"kind":"k","payload":4,"sequence_key":"doc"}]')`).Scan(&batch); err != nil {
		t.Fatal(err)
	}
	fourth, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`5`), SequenceKey: "doc"})
	if err != nil {
		t.Fatal(err)
	}
	line := []uuid.UUID{first.Task.ID, second, batch[0], batch[2], fourth.Task.ID}
	for i, id := range line {
		var no int64
		var waiting int
		var pred *uuid.UUID
		var due int
		if err := db.QueryRow(ctx, `SELECT t.sequence_no, coalesce(t.waiting_for, 0),
			(SELECT d.depends_on FROM ingest_task_dependency d WHERE d.task_id = t.id AND d.reason = 'sequence'),
			(SELECT count(*) FROM outbox_event o WHERE o.task_id = t.id AND o.next_retry_at IS DISTINCT FROM $2)
			FROM ingest_task t WHERE t.id = $1`, id, task.HeldUntil).Scan(&no, &waiting, &pred, &due); err != nil {
			t.Fatal(err)
		}
		switch {
		case no != int64(i+1):
			t.Errorf("task %d of the line: sequence_no %d", i+1, no)
		case i == 0 && (pred != nil || waiting != 0 || due != 1):
			t.Errorf("first task: follows %v, waiting_for %d, %d due outbox rows; want free", pred, waiting, due)
		case i > 0 && (pred == nil || *pred != line[i-1] || waiting != 1 || due != 0):
			t.Errorf("task %d: follows %v (want %s), waiting_for %d, %d due outbox rows; want held", i+1, pred, line[i-1], waiting, due)
		}
	}
	var other int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE id = $1 AND sequence_key = 'other' AND sequence_no = 1 AND coalesce(waiting_for, 0) = 0`, batch[1]).Scan(&other); err != nil || other != 1 {
		t.Errorf("the other key's task is not first and free: %d, %v", other, err)
	}

	for _, c := range []struct{ name, sql, msg string }{
		{"type", `SELECT ingest_enqueue('k', '{}', '{"sequence_key":5}')`, "sequence_key must be a JSON string, got number"},
		{"too long", `SELECT ingest_enqueue('k', '{}', '{"sequence_key":"` + strings.Repeat("k", task.MaxSequenceKeyLength+1) + `"}')`,
			goMsg(t, strings.Repeat("k", task.MaxSequenceKeyLength+1))},
		{"control", `SELECT ingest_enqueue_batch('[{"kind":"k","payload":1,"sequence_key":"a\tb"}]')`, "task 0: " + goMsg(t, "a\tb")},
	} {
		before := 0
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task`).Scan(&before); err != nil {
			t.Fatal(err)
		}
		_, err := db.Exec(ctx, c.sql)
		pg := pgError(t, err)
		if pg.Code != sqlenqueue.CodeInvalid || pg.Message != c.msg || pg.ColumnName != "sequence_key" {
			t.Errorf("%s: raised %s %q (column %q); want %q (column sequence_key)", c.name, pg.Code, pg.Message, pg.ColumnName, c.msg)
		}
		after := 0
		if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task`).Scan(&after); err != nil || after != before {
			t.Errorf("%s: %d tasks written", c.name, after-before)
		}
	}
}

// goMsg is the Go store's message for a task with sequence key key.
func goMsg(t *testing.T, key string) string {
	t.Helper()
	ferr := task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), SequenceKey: key}.Validate(1 << 20)
	if ferr == nil || ferr.Field != "sequence_key" {
		t.Fatalf("the Go store takes sequence key %q: %v", key, ferr)
	}
	return ferr.Msg
}
