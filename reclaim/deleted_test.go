package reclaim

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// The tests of this file run on real Redis only: miniredis v2.40 does not
// return XAUTOCLAIM's third element (ids of deleted pending entries) and
// keeps such entries in the PEL.

// createTasks creates n tasks of kind "test" and publishes them to b's
// stream; it returns them in stream order.
func createTasks(t *testing.T, b *bundle, db *pgxpool.Pool, n int) (*task.Store, []uuid.UUID) {
	t.Helper()
	store, err := task.NewStore(task.Config{Stream: b.stream}, db)
	if err != nil {
		t.Fatal(err)
	}
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "test", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	res, err := store.CreateBatch(context.Background(), nts)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, n)
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	if got := PublishOutbox(t, db, b.rdb, b.stream); got != n {
		t.Fatalf("published %d outbox events, want %d", got, n)
	}
	return store, ids
}

// unsentEvents returns the task ids of NEW outbox events, one per event.
func unsentEvents(t *testing.T, db *pgxpool.Pool, stream string) []uuid.UUID {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT task_id FROM outbox_event WHERE stream = $1 AND status = 'NEW' ORDER BY task_id`, stream)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func sortedIDs(ids []uuid.UUID) []uuid.UUID {
	ids = slices.Clone(ids)
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return ids
}

func TestTrimmedPendingEntriesAreRepublished(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	b := setup(t, testenv.Redis(t), db, 1000, Config{})
	ctx := context.Background()
	store, tasks := createTasks(t, b, db, 100)
	entries := b.read(t, "dead", 100)
	b.setIdle(t, time.Hour, entries...)
	if err := b.rdb.XTrimMaxLen(ctx, b.stream, 10).Err(); err != nil {
		t.Fatal(err)
	}

	// Three of the trimmed entries' tasks need no new entry: one SUCCEEDED,
	// one DEAD, one already has a later outbox event.
	if _, err := store.Start(ctx, "w", time.Minute, tasks[0], tasks[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Succeed(ctx, "w", tasks[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Fail(ctx, "w", task.Failure{ID: tasks[1], Error: "boom", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Insert(ctx, db, b.stream, tasks[2]); err != nil {
		t.Fatal(err)
	}

	res := b.r.runOnce(ctx)
	if res.Deleted != 90 || res.Claimed != 10 || res.Republished != 87 {
		t.Fatalf("round: %+v, want 90 deleted, 10 claimed, 87 republished", res)
	}
	if v := b.counter(t, "deleted"); v != 90 {
		t.Errorf("deleted counter = %v, want 90", v)
	}
	if v := b.counter(t, "claimed"); v != 10 {
		t.Errorf("claimed counter = %v, want 10", v)
	}
	if got, want := unsentEvents(t, db, b.stream), sortedIDs(tasks[2:90]); !slices.Equal(got, want) {
		t.Fatalf("unsent outbox events for %d tasks, want one each for the %d trimmed, unfinished tasks", len(got), len(want))
	}
	if got := sorted(b.sink.ids()); !slices.Equal(got, sorted(entries[90:])) {
		t.Fatalf("sink got %v, want the 10 entries left in the stream", got)
	}
	p := b.pending(t)
	if len(p) != 10 {
		t.Fatalf("%d pending entries left, want 10 (XAUTOCLAIM drops the deleted ones from the PEL)", len(p))
	}
	// Nothing is reported twice.
	b.setIdle(t, time.Hour, entries[90:]...)
	if res := b.r.runOnce(ctx); res.Deleted != 0 || res.Republished != 0 {
		t.Fatalf("second round: %+v, want nothing deleted or republished", res)
	}
	if got := len(unsentEvents(t, db, b.stream)); got != 88 {
		t.Fatalf("%d unsent outbox events after the second round, want 88", got)
	}
}

func TestDeletedEntryWithoutOutboxEvent(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	b := setup(t, testenv.Redis(t), db, 10, Config{})
	ctx := context.Background()
	ids := b.add(t, 2) // written directly, not through the outbox
	b.read(t, "dead", 2)
	b.setIdle(t, time.Hour, ids...)
	if err := b.rdb.XDel(ctx, b.stream, ids...).Err(); err != nil {
		t.Fatal(err)
	}
	res := b.r.runOnce(ctx)
	if res.Deleted != 2 || res.Republished != 0 {
		t.Fatalf("round: %+v, want 2 deleted, none republished", res)
	}
	if v := b.counter(t, "error"); v != 0 {
		t.Errorf("error counter = %v, want 0", v)
	}
	if n := len(b.pending(t)); n != 0 {
		t.Errorf("%d pending entries left, want 0", n)
	}
}

func TestDeletedEntriesRetriedAfterDatabaseError(t *testing.T) {
	t.Parallel()
	database := testenv.NewDatabase(t)
	b := setup(t, testenv.Redis(t), database.Pool, 100, Config{})
	ctx := context.Background()
	_, tasks := createTasks(t, b, database.Pool, 5)
	entries := b.read(t, "dead", 5)
	b.setIdle(t, time.Hour, entries...)
	if err := b.rdb.XDel(ctx, b.stream, entries...).Err(); err != nil {
		t.Fatal(err)
	}

	down, err := pgxpool.New(ctx, database.URL)
	if err != nil {
		t.Fatal(err)
	}
	down.Close() // every statement fails: "closed pool"
	b.r.db = down
	res := b.r.runOnce(ctx)
	if res.Deleted != 5 || res.Republished != 0 {
		t.Fatalf("round with Postgres down: %+v, want 5 deleted, none republished", res)
	}
	if v := b.counter(t, "error"); v != 1 {
		t.Errorf("error counter = %v, want 1", v)
	}
	if n := len(b.pending(t)); n != 0 {
		t.Fatalf("%d pending entries, want 0 (XAUTOCLAIM removed them: only the backlog has them)", n)
	}

	b.r.db = database.Pool // Postgres is back
	if res := b.r.runOnce(ctx); res.Republished != 5 {
		t.Fatalf("round with Postgres back: %+v, want 5 republished from the backlog", res)
	}
	if got := unsentEvents(t, database.Pool, b.stream); !slices.Equal(got, sortedIDs(tasks)) {
		t.Fatalf("unsent outbox events for %v, want %v", got, tasks)
	}
	if res := b.r.runOnce(ctx); res.Republished != 0 {
		t.Fatalf("third round republished %d, want 0 (backlog empty)", res.Republished)
	}
}
