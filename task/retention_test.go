package task_test

import (
	"context"
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// aged creates a task of kind with its creation audit and outbox rows,
// puts it in state st, finished (unless st is not terminal) ago, and
// moves its id (a UUIDv7 of its creation time) back by ago too, as it
// would be had it been created then. It returns the task's id.
func (b *bundle) aged(t *testing.T, kind string, st task.State, ago time.Duration) uuid.UUID {
	t.Helper()
	old := b.create(t, task.NewTask{Kind: kind}).ID
	id := old
	binary.BigEndian.PutUint16(id[4:6], 0)
	ms := uint64(time.Now().Add(-ago).UnixMilli())
	id[0], id[1], id[2], id[3], id[4], id[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	finished := "now() - $3::bigint * interval '1 millisecond'"
	if !st.Terminal() {
		finished = "CASE WHEN $3::bigint < 0 THEN now() END" // NULL
	}
	for _, q := range []string{
		`UPDATE ingest_task SET id = $2, status = $4, finished_at = ` + finished + `,
		    last_error = CASE WHEN $4 = 'DEAD' THEN 'boom' END,
		    cancel_requested_at = CASE WHEN $4 = 'CANCELLED' THEN now() END,
		    lease_owner = CASE WHEN $4 = 'RUNNING' THEN 'w' END,
		    lease_until = CASE WHEN $4 = 'RUNNING' THEN now() + interval '1 hour' END WHERE id = $1`,
		`UPDATE ingest_task_transition SET task_id = $2 WHERE task_id = $1 AND $3::bigint IS NOT NULL AND $4::text IS NOT NULL`,
		`UPDATE outbox_event SET task_id = $2 WHERE task_id = $1 AND $3::bigint IS NOT NULL AND $4::text IS NOT NULL`,
	} {
		if _, err := b.db.Exec(b.ctx, q, old, id, ago.Milliseconds(), string(st)); err != nil {
			t.Fatalf("age task: %v", err)
		}
	}
	return id
}

// taskRows counts the task's rows in ingest_task, its audit and outbox rows.
func (b *bundle) taskRows(t *testing.T, id uuid.UUID) [3]int {
	t.Helper()
	return [3]int{
		b.count(t, `SELECT count(*) FROM ingest_task WHERE id = $1`, id),
		b.count(t, `SELECT count(*) FROM ingest_task_transition WHERE task_id = $1`, id),
		b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id),
	}
}

func TestDeleteExpiredDeletesOnlyFinishedTasksPastTheirWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	w := task.Windows{Succeeded: time.Hour, Cancelled: 2 * time.Hour, Dead: 3 * time.Hour}
	type tc struct {
		st   task.State
		ago  time.Duration
		gone bool
	}
	cases := []tc{
		{task.Succeeded, 61 * time.Minute, true}, {task.Succeeded, 59 * time.Minute, false},
		{task.Cancelled, 121 * time.Minute, true}, {task.Cancelled, 119 * time.Minute, false},
		{task.Dead, 181 * time.Minute, true}, {task.Dead, 179 * time.Minute, false},
		// Not finished: never deleted, however old.
		{task.Queued, 1000 * time.Hour, false}, {task.Running, 1000 * time.Hour, false},
		{task.Retrying, 1000 * time.Hour, false},
	}
	ids := make([]uuid.UUID, len(cases))
	for i, c := range cases {
		ids[i] = b.aged(t, "ret", c.st, c.ago)
		if got := b.taskRows(t, ids[i]); got != [3]int{1, 1, 1} {
			t.Fatalf("%s: rows before %v, want a task with one audit and one outbox row", c.st, got)
		}
	}
	// Batches of 2: the pass goes on until a batch is short.
	var deleted []task.Deleted
	for {
		d, err := task.DeleteExpired(b.ctx, b.db, w, 2)
		if err != nil {
			t.Fatal(err)
		}
		deleted = append(deleted, d...)
		if len(d) < 2 {
			break
		}
	}
	got := map[uuid.UUID]task.State{}
	for _, d := range deleted {
		got[d.ID] = d.Status
	}
	for i, c := range cases {
		rows := b.taskRows(t, ids[i])
		if c.gone {
			// The audit and outbox rows stay until their partitions
			// are dropped.
			if got[ids[i]] != c.st || rows != [3]int{0, 1, 1} {
				t.Errorf("%s finished %s ago: returned %q, rows %v; want deleted, its audit and outbox rows kept", c.st, c.ago, got[ids[i]], rows)
			}
		} else if _, ok := got[ids[i]]; ok || rows != [3]int{1, 1, 1} {
			t.Errorf("%s %s old: returned %v, rows %v; want kept", c.st, c.ago, ok, rows)
		}
	}
	if len(deleted) != 3 {
		t.Errorf("deleted %d tasks, want 3", len(deleted))
	}
}

func TestDeleteExpiredKeepForever(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	s := b.aged(t, "ret", task.Succeeded, 1000*time.Hour)
	d := b.aged(t, "ret", task.Dead, 1000*time.Hour)
	c := b.aged(t, "ret", task.Cancelled, 1000*time.Hour)
	// Only SUCCEEDED has a window: the others are kept.
	out, err := task.DeleteExpired(b.ctx, b.db, task.Windows{Succeeded: time.Hour, Cancelled: task.KeepForever, Dead: task.KeepForever}, 100)
	if err != nil || len(out) != 1 || out[0].ID != s {
		t.Fatalf("deleted %v, %v; want only the SUCCEEDED task", out, err)
	}
	all := task.Windows{Succeeded: task.KeepForever, Cancelled: task.KeepForever, Dead: task.KeepForever}
	if out, err := task.DeleteExpired(b.ctx, b.db, all, 100); err != nil || len(out) != 0 {
		t.Fatalf("every window forever: deleted %v, %v", out, err)
	}
	if b.taskRows(t, d) != [3]int{1, 1, 1} || b.taskRows(t, c) != [3]int{1, 1, 1} {
		t.Fatal("a task kept forever lost rows")
	}
}

func TestDeleteExpiredSkipsALockedTask(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	locked := b.aged(t, "ret", task.Succeeded, 2*time.Hour)
	free := b.aged(t, "ret", task.Succeeded, 2*time.Hour)
	tx, err := b.db.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM ingest_task WHERE id = $1 FOR UPDATE`, locked); err != nil {
		t.Fatal(err)
	}
	// A statement that waited on the lock would hit this timeout.
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	out, err := task.DeleteExpired(ctx, b.db, task.Windows{Succeeded: time.Hour}, 100)
	if err != nil || len(out) != 1 || out[0].ID != free {
		t.Fatalf("deleted %v, %v; want the unlocked task only", out, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	out, err = task.DeleteExpired(b.ctx, b.db, task.Windows{Succeeded: time.Hour}, 100)
	if err != nil || len(out) != 1 || out[0].ID != locked {
		t.Fatalf("after the lock: deleted %v, %v; want the once locked task", out, err)
	}
}

func TestDeleteTerminalLeavesUnfinishedTasks(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	done := b.aged(t, "ret", task.Dead, time.Minute)
	live := b.aged(t, "ret", task.Running, time.Minute)
	out, err := task.DeleteTerminal(b.ctx, b.db, []uuid.UUID{done, live, uuid.New()})
	want := []task.DeleteResult{{ID: done, Status: task.Dead, Deleted: true}, {ID: live, Status: task.Running}}
	if err != nil || !reflect.DeepEqual(out, want) {
		t.Fatalf("deleted %v, %v; want the DEAD task deleted, the RUNNING one kept", out, err)
	}
	if b.taskRows(t, done) != [3]int{} || b.taskRows(t, live) != [3]int{1, 1, 1} {
		t.Fatalf("rows: done %v, live %v", b.taskRows(t, done), b.taskRows(t, live))
	}
}

// published marks the task's outbox row as published with entry id ids[0]
// of stream, and adds a published row for each further id, plus a row not
// yet published; it returns the entries in publication order.
func (b *bundle) published(t *testing.T, id uuid.UUID, key string, ids ...string) []stream.EntryRef {
	t.Helper()
	var refs []stream.EntryRef
	for i, eid := range ids {
		q := `INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at) VALUES ($1, $2, 'SENT', $3, now())`
		if i == 0 {
			q = `UPDATE outbox_event SET stream = $2, status = 'SENT', stream_id = $3, sent_at = now() WHERE task_id = $1`
		}
		if _, err := b.db.Exec(b.ctx, q, id, key, eid); err != nil {
			t.Fatalf("publish %s: %v", eid, err)
		}
		refs = append(refs, stream.EntryRef{Stream: key, ID: eid})
	}
	if _, err := b.db.Exec(b.ctx, `INSERT INTO outbox_event (task_id, stream) VALUES ($1, $2)`, id, key); err != nil {
		t.Fatal(err)
	}
	return refs
}

// TestDeletionsReturnTheTaskEntries: both deletions of tasks return, for
// each task deleted, the stream entries its outbox rows had published (in
// publication order; none for a task never published), which the caller
// removes from Redis; a kept task has none.
func TestDeletionsReturnTheTaskEntries(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	twice := b.aged(t, "ret", task.Cancelled, 2*time.Hour)
	wantTwice := b.published(t, twice, "s:tasks", "100-0", "200-1")
	never := b.aged(t, "ret", task.Dead, 2*time.Hour)
	live := b.aged(t, "ret", task.Running, 2*time.Hour)
	b.published(t, live, "s:tasks", "300-0")

	res, err := task.DeleteTerminal(b.ctx, b.db, []uuid.UUID{twice, never, live})
	if err != nil {
		t.Fatal(err)
	}
	got := map[uuid.UUID][]stream.EntryRef{}
	for _, r := range res {
		got[r.ID] = r.Entries
	}
	if !reflect.DeepEqual(got, map[uuid.UUID][]stream.EntryRef{twice: wantTwice, never: nil, live: nil}) {
		t.Errorf("DeleteTerminal entries = %v, want %v for the task published twice, none for the others", got, wantTwice)
	}

	expired := b.aged(t, "ret", task.Succeeded, 2*time.Hour)
	wantExpired := b.published(t, expired, "s:tasks", "400-0")
	out, err := task.DeleteExpired(b.ctx, b.db, task.Windows{Succeeded: time.Hour, Cancelled: time.Hour, Dead: time.Hour}, 100)
	if err != nil || len(out) != 1 || out[0].ID != expired || !reflect.DeepEqual(out[0].Entries, wantExpired) {
		t.Fatalf("DeleteExpired = %+v, %v; want task %s with entries %v", out, err, expired, wantExpired)
	}
}
