package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestGroupWindowMatchesCreateTx: ingest_enqueue_batch holds tasks back by
// their group's window as CreateTx does. The same batches through both, on
// a kind of window 2 with a group of weight 2, park the same tasks (due
// now, with a group, beyond the room its window leaves, or behind parked
// tasks of their group), each parked task without an outbox row; a
// delayed task and a task without a group are never held back. Tasks it
// parked are released like the Go store's.
func TestGroupWindowMatchesCreateTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := storeOn(t, "s:window")
	window := 2
	for _, kind := range []string{"go-win", "sql-win"} {
		if _, err := store.SetKind(ctx, "test", kind, task.KindUpdate{GroupWindow: &window, GroupWeights: map[string]int{"heavy": 2}}); err != nil {
			t.Fatal(err)
		}
	}
	type item struct {
		group string
		delay time.Duration
	}
	batches := [][]item{
		{{group: "a"}, {group: "a"}, {group: "a"}, {group: "a"}, {group: "a", delay: time.Hour},
			{group: "heavy"}, {group: "heavy"}, {group: "heavy"}, {group: "heavy"}, {group: "heavy"},
			{}, {}, {}},
		// Room is left in a's window by nobody; b is new.
		{{group: "a"}, {group: "b"}},
	}
	// created lists, per path, each task: its group, whether parked, and
	// its outbox rows.
	created := map[string][]string{}
	var sqlIDs []uuid.UUID
	for _, batch := range batches {
		var nts []task.NewTask
		var js []string
		for i, it := range batch {
			nts = append(nts, task.NewTask{Kind: "go-win", Payload: json.RawMessage(fmt.Sprint(i)), GroupKey: it.group, Delay: it.delay})
			js = append(js, fmt.Sprintf(`{"kind":"sql-win","payload":%d,"group_key":%q,"delay_ms":%d}`, i, it.group, it.delay.Milliseconds()))
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.CreateTx(ctx, tx, nts...)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		var ids []uuid.UUID
		if err := db.QueryRow(ctx, `SELECT ingest_enqueue_batch($1::jsonb)`, "["+strings.Join(js, ",")+"]").Scan(&ids); err != nil {
			t.Fatalf("ingest_enqueue_batch: %v", err)
		}
		sqlIDs = append(sqlIDs, ids...)
		for i := range batch {
			created["go"] = append(created["go"], describe(t, db, res[i].Task.ID))
			created["sql"] = append(created["sql"], describe(t, db, ids[i]))
		}
	}
	want := []string{
		"a in flight 1 row", "a in flight 1 row", "a parked 0 rows", "a parked 0 rows", "a delayed 1 row",
		"heavy in flight 1 row", "heavy in flight 1 row", "heavy in flight 1 row", "heavy in flight 1 row", "heavy parked 0 rows",
		" in flight 1 row", " in flight 1 row", " in flight 1 row",
		"a parked 0 rows", "b in flight 1 row",
	}
	for path, got := range created {
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Errorf("%s path created\n%s\nwant\n%s", path, strings.Join(got, ", "), strings.Join(want, ", "))
		}
	}

	// The tasks the SQL create parked are released as the Go store's are:
	// with group a's window free again (its delayed task, due later, takes
	// no room in it), the oldest two of a, each with an outbox row due now.
	for _, id := range []uuid.UUID{sqlIDs[0], sqlIDs[1], sqlIDs[4]} {
		if _, err := store.Cancel(ctx, "test", "", id); err != nil {
			t.Fatal(err)
		}
	}
	released, err := store.ReleaseParked(ctx, "sql-win", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID]bool{}
	for _, id := range released {
		got[id] = true
	}
	if !got[sqlIDs[2]] || !got[sqlIDs[3]] || got[sqlIDs[13]] {
		t.Errorf("released %v, want the two oldest parked tasks of group a, %s and %s (not %s)", released, sqlIDs[2], sqlIDs[3], sqlIDs[13])
	}
	for _, id := range []uuid.UUID{sqlIDs[2], sqlIDs[3]} {
		if d := describe(t, db, id); d != "a in flight 1 row" {
			t.Errorf("released task %s: %s, want in flight with its outbox row", id, d)
		}
	}
}

// TestGroupWindowCountsTasksInTheStream: a group's window counts its
// tasks in the stream or running, not those that wait elsewhere: with a
// window of 2, three delayed tasks of group d (due in an hour) and two
// tasks of group h waiting for a dependency leave both windows empty, so
// two tasks of each group created next are in flight, through
// ingest_enqueue_batch as through CreateTx; a third one of each is parked.
func TestGroupWindowCountsTasksInTheStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := storeOn(t, "s:count")
	window := 2
	parent, err := store.Create(ctx, task.NewTask{Kind: "parent", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"go-count", "sql-count"} {
		if _, err := store.SetKind(ctx, "test", kind, task.KindUpdate{GroupWindow: &window}); err != nil {
			t.Fatal(err)
		}
	}
	waiting := []task.NewTask{
		{GroupKey: "d", Delay: time.Hour}, {GroupKey: "d", Delay: time.Hour}, {GroupKey: "d", Delay: time.Hour},
		{GroupKey: "h", DependsOn: []uuid.UUID{parent.Task.ID}}, {GroupKey: "h", DependsOn: []uuid.UUID{parent.Task.ID}},
	}
	next := []task.NewTask{{GroupKey: "d"}, {GroupKey: "d"}, {GroupKey: "d"}, {GroupKey: "h"}, {GroupKey: "h"}, {GroupKey: "h"}}
	want := "d in flight 1 row, d in flight 1 row, d parked 0 rows, h in flight 1 row, h in flight 1 row, h parked 0 rows"
	for _, path := range []string{"go", "sql"} {
		var got []string
		for _, batch := range [][]task.NewTask{waiting, next} {
			nts := make([]task.NewTask, len(batch))
			for i, nt := range batch {
				nt.Payload = json.RawMessage(fmt.Sprint(i))
				nts[i] = nt
			}
			ids := createVia(t, db, store, path, path+"-count", nts)
			if len(batch) == len(next) {
				for _, id := range ids {
					got = append(got, describe(t, db, id))
				}
			}
		}
		if g := strings.Join(got, ", "); g != want {
			t.Errorf("%s path: tasks created after the waiting ones\n%s\nwant\n%s", path, g, want)
		}
	}
}

// TestGroupWindowDefault: a kind without a group window holds a group's
// tasks beyond task.DefaultGroupWindow in flight back, through the SQL
// create as through the Go store; ingest_group_window gives the default,
// and a kind's window times a group's weight, at most the kind's
// concurrency_per_group.
func TestGroupWindowDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	useStream(t, db, "s:default-window")
	var ids []uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue_batch(jsonb_agg(jsonb_build_object('kind', 'k', 'payload', i, 'group_key', 'g')))
		FROM generate_series(1, $1::int) i`, task.DefaultGroupWindow+3).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE id = ANY($1) AND parked_at IS NOT NULL`, ids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("%d of %d tasks of one group created parked, want 3 (the window is %d)", n, task.DefaultGroupWindow+3, task.DefaultGroupWindow)
	}
	// ingest_group_window, the window in SQL of the step after the create.
	store := newStore(t, db, task.Config{Stream: "s:default-window"})
	three := 3
	if _, err := store.SetKind(ctx, "test", "weighed", task.KindUpdate{GroupWindow: &three, GroupWeights: map[string]int{"heavy": 2}}); err != nil {
		t.Fatal(err)
	}
	four, five := 4, 5
	if _, err := store.SetKind(ctx, "test", "capped", task.KindUpdate{GroupWindow: &three, ConcurrencyPerGroup: &four, GroupWeights: map[string]int{"heavy": 2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.SetKind(ctx, "test", "defaultcap", task.KindUpdate{ConcurrencyPerGroup: &five}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		kind, group string
		want        int
	}{{"k", "g", task.DefaultGroupWindow}, {"weighed", "g", 3}, {"weighed", "heavy", 6},
		// At most the kind's concurrency_per_group.
		{"capped", "g", 3}, {"capped", "heavy", 4}, {"defaultcap", "g", 5}} {
		var got int
		if err := db.QueryRow(ctx, `SELECT ingest_group_window($1, $2)`, c.kind, c.group).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("ingest_group_window(%q, %q) = %d, want %d", c.kind, c.group, got, c.want)
		}
	}
}

// describe says of task id: its group, whether it is parked, waiting for
// an edge, delayed or in flight, and how many outbox rows it has.
func describe(t *testing.T, db *pgxpool.Pool, id uuid.UUID) string {
	t.Helper()
	var group, state string
	var rows int
	if err := db.QueryRow(context.Background(), `SELECT coalesce(group_key, ''),
		CASE WHEN parked_at IS NOT NULL THEN 'parked' WHEN waiting_for > 0 THEN 'waiting'
		     WHEN next_retry_at IS NOT NULL THEN 'delayed' ELSE 'in flight' END,
		(SELECT count(*) FROM outbox_event o WHERE o.task_id = t.id)
		FROM ingest_task t WHERE id = $1`, id).Scan(&group, &state, &rows); err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	plural := "s"
	if rows == 1 {
		plural = ""
	}
	return fmt.Sprintf("%s %s %d row%s", group, state, rows, plural)
}

// TestGroupWindowLeavesWaitingTasks: a task that will wait for an edge
// (a dependency, or an earlier task of its sequence) takes no room in its
// group's window and is not created parked, through the SQL create as
// through the Go store, though the SQL entry points link the edges after
// the window is decided. On a kind of window 1, with group p already
// holding a parked task: of g's three tasks, the one that depends on an
// unfinished task waits, the next is in flight, the third parked; of h's
// three, the first of the sequence is in flight, the second waits for it,
// the third is parked; p's waiting task waits, unparked, and its other
// task is parked behind the older parked one. Each waiting task has one
// outbox row, held back.
func TestGroupWindowLeavesWaitingTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := storeOn(t, "s:waits")
	window := 1
	parent, err := store.Create(ctx, task.NewTask{Kind: "parent", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"go-waits", "sql-waits"} {
		if _, err := store.SetKind(ctx, "test", kind, task.KindUpdate{GroupWindow: &window}); err != nil {
			t.Fatal(err)
		}
	}
	dep := []uuid.UUID{parent.Task.ID}
	fill := []task.NewTask{{GroupKey: "p"}, {GroupKey: "p"}}
	batch := []task.NewTask{
		{GroupKey: "g", DependsOn: dep}, {GroupKey: "g"}, {GroupKey: "g"},
		{GroupKey: "h", SequenceKey: "doc"}, {GroupKey: "h", SequenceKey: "doc"}, {GroupKey: "h"},
		{GroupKey: "p", DependsOn: dep}, {GroupKey: "p"},
	}
	want := "g waiting 1 row, g in flight 1 row, g parked 0 rows, h in flight 1 row, h waiting 1 row, h parked 0 rows, p waiting 1 row, p parked 0 rows"
	for _, path := range []string{"go", "sql"} {
		kind := path + "-waits"
		var ids []uuid.UUID
		for n, b := range [][]task.NewTask{fill, batch} {
			nts := make([]task.NewTask, len(b))
			for i, nt := range b {
				nt.Payload = json.RawMessage(fmt.Sprint(n*100 + i))
				nts[i] = nt
			}
			ids = createVia(t, db, store, path, kind, nts)
		}
		var got []string
		for _, id := range ids {
			got = append(got, describe(t, db, id))
		}
		if g := strings.Join(got, ", "); g != want {
			t.Errorf("%s path:\n%s\nwant\n%s", path, g, want)
		}
		var due int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox_event o JOIN ingest_task t ON t.id = o.task_id
			WHERE t.id = ANY($1) AND t.waiting_for > 0 AND o.next_retry_at < $2`, ids, task.HeldUntil).Scan(&due); err != nil {
			t.Fatal(err)
		}
		if due != 0 {
			t.Errorf("%s path: %d outbox rows of waiting tasks due before %v, want none", path, due, task.HeldUntil)
		}
	}
}
