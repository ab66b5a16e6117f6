package transition_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/transition"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup returns a fresh database and the id of a task row in it (audit rows
// reference ingest_task).
func setup(t *testing.T) (context.Context, *pgxpool.Pool, uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	db := testenv.DB(t)
	return ctx, db, newTask(t, db)
}

func newTask(t *testing.T, db *pgxpool.Pool) uuid.UUID {
	t.Helper()
	id := uuid.New()
	if _, err := db.Exec(context.Background(), `INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
		VALUES ($1, 'k', '{}', 'sha', 3)`, id); err != nil {
		t.Fatalf("insert task: %v", err)
	}
	return id
}

func TestInsertListRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, db, id := setup(t)
	other := newTask(t, db)
	recs := []transition.Record{
		{TaskID: id, To: "QUEUED", Message: "created"},
		{TaskID: id, From: "QUEUED", To: "RUNNING", AttemptCount: 0, Worker: "host-1", Message: "attempt 1"},
		{TaskID: other, To: "QUEUED"},
		{TaskID: id, From: "RUNNING", To: "RETRYING", AttemptCount: 1, Worker: "host-1", Message: "boom: é ✓"},
	}
	before := time.Now().Add(-time.Minute)
	if err := transition.Insert(ctx, db, recs...); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	got, err := transition.List(ctx, db, id)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	want := []transition.Record{recs[0], recs[1], recs[3]}
	if len(got) != len(want) {
		t.Fatalf("List returned %d records, want %d: %+v", len(got), len(want), got)
	}
	for i, g := range got {
		w := want[i]
		if g.TaskID != w.TaskID || g.From != w.From || g.To != w.To || g.AttemptCount != w.AttemptCount || g.Message != w.Message || g.Worker != w.Worker {
			t.Fatalf("record %d = %+v, want %+v", i, g, w)
		}
		if g.ID == 0 || (i > 0 && g.ID <= got[i-1].ID) {
			t.Fatalf("record ids %d after %d: want increasing, oldest first", g.ID, got[max(i-1, 0)].ID)
		}
		if g.CreatedAt.Before(before) || g.CreatedAt.After(time.Now().Add(time.Minute)) {
			t.Fatalf("record %d created_at %v is not now", i, g.CreatedAt)
		}
	}
	// Empty strings are stored as NULL, as the contract's SQL queries expect.
	var nulls int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task_transition
		WHERE task_id = $1 AND from_status IS NULL AND worker IS NULL AND message IS NULL`, other).Scan(&nulls); err != nil || nulls != 1 {
		t.Fatalf("creation row of the other task: %d rows with NULL from/worker/message (%v), want 1", nulls, err)
	}
	if o, err := transition.List(ctx, db, other); err != nil || len(o) != 1 || o[0].From != "" || o[0].Worker != "" {
		t.Fatalf("List(other) = %+v, %v", o, err)
	}
}

func TestInsertInTransaction(t *testing.T) {
	t.Parallel()
	ctx, db, id := setup(t)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := transition.Insert(ctx, tx, transition.Record{TaskID: id, To: "QUEUED"}); err != nil {
		t.Fatalf("Insert in a transaction: %v", err)
	}
	if got, err := transition.List(ctx, tx, id); err != nil || len(got) != 1 {
		t.Fatalf("List in the transaction = %+v, %v; want the uncommitted row", got, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := transition.List(ctx, db, id); err != nil || len(got) != 0 {
		t.Fatalf("List after rollback = %+v, %v; want nothing", got, err)
	}
}

func TestInsertNothing(t *testing.T) {
	t.Parallel()
	// No records: no statement at all, so even a nil DBTX is fine.
	if err := transition.Insert(context.Background(), nil); err != nil {
		t.Fatalf("Insert() = %v", err)
	}
}

func TestInsertErrors(t *testing.T) {
	t.Parallel()
	ctx, db, id := setup(t)
	tests := []struct {
		name string
		rec  transition.Record
	}{
		{"UnknownTask", transition.Record{TaskID: uuid.New(), To: "QUEUED"}},
		{"UnknownState", transition.Record{TaskID: id, To: "PAUSED"}},
		{"NoToState", transition.Record{TaskID: id}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := transition.Insert(ctx, db, tt.rec)
			if err == nil || !strings.Contains(err.Error(), "insert 1 transitions") {
				t.Fatalf("Insert(%+v) = %v, want an error saying what failed", tt.rec, err)
			}
		})
	}
	if got, err := transition.List(ctx, db, id); err != nil || len(got) != 0 {
		t.Fatalf("failed inserts left %+v (%v)", got, err)
	}
}

func TestListUnknownTask(t *testing.T) {
	t.Parallel()
	ctx, db, _ := setup(t)
	got, err := transition.List(ctx, db, uuid.New())
	if err != nil || len(got) != 0 {
		t.Fatalf("List of an unknown task = %+v, %v; want empty", got, err)
	}
}
