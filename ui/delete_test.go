package ui_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// TestDeleteRunNowDiscard: the task page offers "Run now" for a task
// waiting for a later time and "Delete task" for a finished one, the DLQ
// page "Discard" for an entry, each behind a confirmation box: without it
// nothing changes; with it the delayed task is due now, the DEAD task is
// gone with its DLQ entry, and a discarded entry is gone while its task
// stays DEAD.
func TestDeleteRunNowDiscard(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)
	csrf := c.csrf("/ui/")
	form := func(kv ...string) url.Values {
		v := url.Values{"csrf": {csrf}}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	flash := func(p page, msg string) {
		t.Helper()
		want(t, p, 303)
		want(t, c.get(p.header.Get("Location")), 200, msg)
	}
	delayed, dead := f.delayed.ID.String(), f.dead.ID.String()
	want(t, c.get("/ui/tasks/"+delayed), 200, `id="run-now"`, `name="confirm"`)
	want(t, c.get("/ui/tasks/"+dead), 200, `id="delete"`, `name="confirm"`)
	if p := c.get("/ui/tasks/" + f.queued.ID.String()); contains(p, `id="run-now"`) || contains(p, `id="delete"`) {
		t.Fatalf("a due QUEUED task's page offers run-now or delete")
	}

	// Without the confirmation nothing happens.
	flash(c.post("/ui/tasks/"+delayed+"/run", form()), "tick the confirmation box")
	flash(c.post("/ui/tasks/"+dead+"/delete", form()), "tick the confirmation box")
	if tk, err := b.store.Get(b.ctx, f.delayed.ID); err != nil || tk.NextRetryAt == nil || !tk.NextRetryAt.After(f.delayed.CreatedAt.Add(30*time.Minute)) {
		t.Fatalf("unconfirmed run-now changed the task: %+v %v", tk.NextRetryAt, err)
	}
	if s := b.status(t, f.dead.ID); s != task.Dead {
		t.Fatalf("unconfirmed delete: status %s", s)
	}

	flash(c.post("/ui/tasks/"+delayed+"/run", form("confirm", "yes")), "Task due now")
	flash(c.post("/ui/tasks/"+delayed+"/run", form("confirm", "yes")), "already due")
	flash(c.post("/ui/tasks/"+f.queued.ID.String()+"/delete", form("confirm", "yes")), "only SUCCEEDED, DEAD and CANCELLED")

	flash(c.post("/ui/tasks/"+dead+"/delete", form("confirm", "yes")), "deleted with its history; 1 DLQ entries removed")
	if _, err := b.store.Get(b.ctx, f.dead.ID); err == nil {
		t.Fatal("the deleted task still exists")
	}
	if n := b.dlqLen(t); n != 0 {
		t.Fatalf("DLQ length %d after deleting its task", n)
	}

	// Discard: the entry goes, the task stays DEAD.
	other := b.create(t, task.NewTask{Kind: "embed"})
	b.kill(t, other.ID, "boom")
	entries, err := b.rdb.XRange(b.ctx, b.dlqKey, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("DLQ entries %v %v", entries, err)
	}
	want(t, c.get("/ui/dlq"), 200, "/ui/dlq/discard")
	flash(c.post("/ui/dlq/discard", form("entry", entries[0].ID)), "tick the confirmation box")
	flash(c.post("/ui/dlq/discard", form("entry", entries[0].ID, "confirm", "yes")), "discarded")
	if n := b.dlqLen(t); n != 0 {
		t.Fatalf("DLQ length %d after the discard", n)
	}
	if s := b.status(t, other.ID); s != task.Dead {
		t.Fatalf("discarded entry's task is %s, want DEAD", s)
	}
	flash(c.post("/ui/dlq/discard", form("entry", entries[0].ID, "confirm", "yes")), "not found")
}

func contains(p page, s string) bool { return strings.Contains(p.body, s) }
