package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// TestDelayedTasksHeldToTheirGroupWindow: a delayed task with a group is
// held to its group's window when it falls due. With a window of 2 and
// one task of group g in flight, of g's four delayed tasks the relay
// publishes the one that fits and parks the other three, deleting their
// outbox rows; a delayed task of another group and one without a group are
// published. Before they fall due, the delayed tasks take no room: a task
// of g created meanwhile is not parked. A parked task is released when
// its group has room, and its new row is published, not held again.
func TestDelayedTasksHeldToTheirGroupWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const kind = "win"
	b.window(t, kind, 2)
	r := b.relay(t, outbox.RelayConfig{ID: "hold-relay"})
	newTask := func(i int, group string, delay time.Duration) task.NewTask {
		return task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprint(i)), GroupKey: group, Delay: delay}
	}
	// Long enough for the creates below to come first on a slow machine.
	const delay = 2 * time.Second
	res, err := b.store.CreateBatch(ctx, []task.NewTask{
		newTask(0, "g", delay), newTask(1, "g", delay), newTask(2, "g", delay), newTask(3, "g", delay),
		newTask(4, "other", delay), newTask(5, "", delay),
	})
	if err != nil {
		t.Fatal(err)
	}
	delayed := make([]uuid.UUID, len(res))
	for i, cr := range res {
		delayed[i] = cr.Task.ID
	}
	created, err := b.store.Create(ctx, newTask(6, "g", 0))
	if err != nil {
		t.Fatal(err)
	}
	now := created.Task
	if now.ParkedAt != nil {
		t.Fatal("a task of g created while g's four delayed tasks are not due was parked: they took room in its window of 2")
	}

	// Once every row is due, passes until none is left.
	testenv.Eventually(t, 60*time.Second, "the delayed rows due", func() bool {
		return b.count(t, `status = 'NEW' AND next_retry_at > now()`) == 0
	})
	total := drainAll(t, r)
	if total.Published != 4 || total.Held != 3 {
		t.Errorf("passes published %d rows and held %d, want 4 (g's task due now, one of g's delayed tasks, other's, the ungrouped one) and 3", total.Published, total.Held)
	}
	parked := b.parked(t, delayed...)
	for i, id := range delayed {
		rows := b.count(t, `task_id = $1`, id)
		switch want := i >= 1 && i <= 3; {
		case parked[id] != want:
			t.Errorf("delayed task %d: parked %v, want %v", i, parked[id], want)
		case want && rows != 0:
			t.Errorf("parked delayed task %d has %d outbox rows, want 0 (its row is withdrawn)", i, rows)
		case !want && b.count(t, `task_id = $1 AND status = 'SENT'`, id) != 1:
			t.Errorf("delayed task %d: not published", i)
		}
	}
	b.checkPublishedOnce(t, 4)

	// g's window is full (the task due now and delayed task 0): nothing
	// is released. Once one of them ends, the oldest parked one is, and
	// its new row is published.
	if rel, err := b.store.ReleaseParked(ctx, kind, 0, 0); err != nil || len(rel) != 0 {
		t.Fatalf("release with g's window full: %v, %v; want nothing", rel, err)
	}
	if _, err := b.store.Cancel(ctx, "test", "", now.ID); err != nil {
		t.Fatal(err)
	}
	rel, err := b.store.ReleaseParked(ctx, kind, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rel) != 1 || rel[0] != delayed[1] {
		t.Fatalf("released %v, want the oldest parked task of g, %s", rel, delayed[1])
	}
	res1, err := r.DrainOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res1.Published != 1 || res1.Held != 0 {
		t.Errorf("the released task's pass published %d and held %d, want 1 and 0", res1.Published, res1.Held)
	}
	b.checkPublishedOnce(t, 5)
}

// parked tells which of ids are parked.
func (b *bundle) parked(t *testing.T, ids ...uuid.UUID) map[uuid.UUID]bool {
	t.Helper()
	rows, err := b.db.Query(context.Background(), `SELECT id, parked_at IS NOT NULL FROM ingest_task WHERE id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]bool{}
	for rows.Next() {
		var id uuid.UUID
		var p bool
		if err := rows.Scan(&id, &p); err != nil {
			t.Fatal(err)
		}
		out[id] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHoldDoesNotWaitForAnOpenCreate: a caller's transaction that created
// a task of a group (CreateTx) holds the group's lock until it ends; a
// relay's pass over a delayed task of that group falling due meanwhile
// does not wait for it, and publishes the task unheld.
func TestHoldDoesNotWaitForAnOpenCreate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const kind = "win-open"
	b.window(t, kind, 1)
	r := b.relay(t, outbox.RelayConfig{ID: "hold-open-relay"})
	delayed, err := b.store.Create(ctx, task.NewTask{Kind: kind, Payload: json.RawMessage(`1`), GroupKey: "g", Delay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := b.store.CreateTx(ctx, tx, task.NewTask{Kind: kind, Payload: json.RawMessage(`2`), GroupKey: "g"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the delayed row due", func() bool {
		return b.count(t, `task_id = $1 AND next_retry_at <= now()`, delayed.Task.ID) == 1
	})
	done := make(chan outbox.DrainResult, 1)
	go func() {
		res, err := r.DrainOnce(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case res := <-done:
		if res.Published != 1 || res.Held != 0 {
			t.Errorf("the pass published %d rows and held %d, want the delayed task published, unheld", res.Published, res.Held)
		}
	case <-time.After(60 * time.Second):
		_ = tx.Rollback(ctx) // lets the pass end
		t.Fatal("the pass waited for the open transaction that holds the group's lock")
	}
}

// TestRedrivenTasksHeldToTheirGroupWindow: tasks of a group that a
// redrive makes due again are held to its window too. With a window of 1,
// of three cancelled tasks of h redriven together the relay publishes one
// and parks two.
func TestRedrivenTasksHeldToTheirGroupWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const kind = "win-redrive"
	b.window(t, kind, 1)
	r := b.relay(t, outbox.RelayConfig{ID: "hold-redrive-relay"})
	hs, err := b.store.CreateBatch(ctx, []task.NewTask{
		{Kind: kind, Payload: json.RawMessage(`1`), GroupKey: "h"},
		{Kind: kind, Payload: json.RawMessage(`2`), GroupKey: "h"},
		{Kind: kind, Payload: json.RawMessage(`3`), GroupKey: "h"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for _, cr := range hs {
		ids = append(ids, cr.Task.ID)
	}
	for _, id := range ids {
		if _, err := b.store.Cancel(ctx, "test", "", id); err != nil {
			t.Fatal(err)
		}
	}
	drainAll(t, r) // the first task's row, created within the window
	if _, err := b.store.Redrive(ctx, "test", ids...); err != nil {
		t.Fatal(err)
	}
	if res, parked := drainAll(t, r), b.countParked(t, ids...); res.Published != 1 || res.Held != 2 || parked != 2 {
		t.Errorf("redriven together: %d published, %d held, %d parked; want 1, 2 and 2 (a window of 1)", res.Published, res.Held, parked)
	}
}

// TestReleasedTasksHeldToTheirGroupWindow: tasks of a group waiting for a
// dependency take no room in its window and are not parked by it at
// create; the end of their dependency makes them due, and the relay holds
// them to the window then. With a window of 1, of three tasks of g
// released together the relay publishes one and parks two.
func TestReleasedTasksHeldToTheirGroupWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const kind = "win-release"
	b.window(t, kind, 1)
	r := b.relay(t, outbox.RelayConfig{ID: "hold-release-relay"})
	parent, err := b.store.Create(ctx, task.NewTask{Kind: "parent", Payload: json.RawMessage(`0`)})
	if err != nil {
		t.Fatal(err)
	}
	nts := make([]task.NewTask, 3)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprint(i)), GroupKey: "g",
			DependsOn: []uuid.UUID{parent.Task.ID}, OnDependencyFailure: task.OnFailureRun}
	}
	created, err := b.store.CreateBatch(ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	for _, cr := range created {
		ids = append(ids, cr.Task.ID)
		if cr.Task.ParkedAt != nil {
			t.Errorf("task %s, waiting for its dependency, was parked by its group's window", cr.Task.ID)
		}
	}
	if _, err := r.DrainOnce(ctx); err != nil { // the parent
		t.Fatal(err)
	}
	if _, err := b.store.Cancel(ctx, "test", "", parent.Task.ID); err != nil {
		t.Fatal(err)
	}
	if res, parked := drainAll(t, r), b.countParked(t, ids...); res.Published != 1 || res.Held != 2 || parked != 2 {
		t.Errorf("released together: %d published, %d held, %d parked; want 1, 2 and 2 (a window of 1)", res.Published, res.Held, parked)
	}
}

// window sets kind's group window to w.
func (b *bundle) window(t *testing.T, kind string, w int) {
	t.Helper()
	if _, err := b.store.SetKind(context.Background(), "test", kind, task.KindUpdate{GroupWindow: &w}); err != nil {
		t.Fatal(err)
	}
}

// countParked counts the parked tasks among ids.
func (b *bundle) countParked(t *testing.T, ids ...uuid.UUID) int {
	t.Helper()
	n := 0
	for _, p := range b.parked(t, ids...) {
		if p {
			n++
		}
	}
	return n
}
