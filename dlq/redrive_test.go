package dlq_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// dying runs tasks to their death as a worker does: started, failed for
// good, and dead-lettered with the time of that death.
type dying struct {
	t      *testing.T
	store  *task.Store
	rdb    *redis.Client
	stream string
	w      *dlq.Writer
}

// die kills task id once more and dead-letters it; it returns the entry id.
func (d dying) die(id uuid.UUID) string {
	d.t.Helper()
	ctx := context.Background()
	if _, err := d.store.Start(ctx, "w", time.Minute, id); err != nil {
		d.t.Fatal(err)
	}
	res, err := d.store.Fail(ctx, "w", task.Failure{ID: id, Error: "bad", Permanent: true})
	if err != nil || len(res) != 1 || res[0].Status != task.Dead || res[0].FinishedAt == nil {
		d.t.Fatalf("fail %s: %+v %v", id, res, err)
	}
	src := pendingEntry(d.t, d.rdb, d.stream, "task_id", id.String())
	eid, err := d.w.Write(ctx, dlq.Entry{TaskID: id.String(), Kind: "k", SourceID: src, LastError: "bad",
		DeadAt: *res[0].FinishedAt, Death: id.String() + ":" + res[0].FinishedAt.String()})
	if err != nil || eid == "" {
		d.t.Fatalf("dead-letter %s: %q %v", id, eid, err)
	}
	return eid
}

// dyingAgain is the store as Redrive sees it, whose redriven tasks run
// and die again before Redrive goes on to remove their DLQ entries.
type dyingAgain struct {
	dying
	again []string // the entries of the second deaths
}

func (d *dyingAgain) Redrive(ctx context.Context, actor string, ids ...uuid.UUID) ([]task.Result, error) {
	res, err := d.store.Redrive(ctx, actor, ids...)
	for _, id := range task.Redriven(res) {
		d.again = append(d.again, d.die(id))
	}
	return res, err
}

// TestRedriveKeepsTheEntryOfALaterDeath: a task redriven that runs and
// dies again before the redrive removes its DLQ entries keeps the entry of
// its new death (the DLQ holds one entry per DEAD task); the entry of the
// death the redrive undid goes. By task id (Redrive) and by filter
// (RedriveMatching).
func TestRedriveKeepsTheEntryOfALaterDeath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key, dlqKey := testenv.Keys(t)
	rdb := testenv.Redis(t)
	store, err := task.NewStore(task.Config{Stream: key}, testenv.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	w, err := dlq.NewWriter(dlq.Config{Stream: key, Group: group, DLQ: dlqKey}, rdb)
	if err != nil {
		t.Fatal(err)
	}
	d := dying{t: t, store: store, rdb: rdb, stream: key, w: w}
	newDead := func(kind string) (uuid.UUID, string) {
		created, err := store.Create(ctx, task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		return created.Task.ID, d.die(created.Task.ID)
	}
	left := func(id uuid.UUID) []string {
		all, err := dlq.List(ctx, rdb, dlqKey, dlq.ListParams{Count: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range all {
			if e.TaskID == id.String() {
				out = append(out, e.ID)
			}
		}
		return out
	}

	id, first := newDead("k")
	again := &dyingAgain{dying: d}
	if _, n, err := dlq.Redrive(ctx, rdb, dlqKey, again, "operator", id); err != nil || n != 1 {
		t.Fatalf("Redrive: %d entries removed, %v; want the one of the first death", n, err)
	}
	if got := left(id); len(got) != 1 || got[0] != again.again[0] || got[0] == first {
		t.Errorf("by id: entries left %v; want only the new death's %s", got, again.again[0])
	}

	id, first = newDead("bulk")
	var second string
	res, err := dlq.RedriveMatching(ctx, rdb, dlqKey, store, "operator", task.RedriveFilter{Status: task.Dead, Kind: "bulk"},
		task.RedriveOptions{Redriven: func(_ context.Context, res []task.Result) error {
			for _, moved := range task.Redriven(res) {
				second = d.die(moved)
			}
			return nil
		}})
	if err != nil || res.Redriven != 1 || res.DLQRemoved != 1 {
		t.Fatalf("RedriveMatching: %+v %v; want 1 redriven, 1 entry removed", res, err)
	}
	if got := left(id); len(got) != 1 || got[0] != second || got[0] == first {
		t.Errorf("by filter: entries left %v; want only the new death's %s", got, second)
	}
}
