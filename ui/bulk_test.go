package ui_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestBulkActions: the task list ticks tasks by id (one box a row, all of
// the page with ?select=all) and redrives, cancels or deletes them behind
// a confirmation box, through the functions the one-task actions use; the
// message counts what was done and what was refused, and why. Bad, excess
// and cross-site requests are refused and change nothing.
func TestBulkActions(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)
	csrf := c.csrf("/ui/tasks")
	queued, delayed, dead, cancelled := f.queued.ID.String(), f.delayed.ID.String(), f.dead.ID.String(), f.cancelled.ID.String()
	bulk := func(action string, confirm bool, ids ...string) url.Values {
		v := url.Values{"csrf": {csrf}, "action": {action}, "id": ids, "back": {"/ui/tasks?status=DEAD"}}
		if confirm {
			v.Set("confirm", "yes")
		}
		return v
	}
	flash := func(p page, msg string) {
		t.Helper()
		want(t, p, 303)
		if loc := p.header.Get("Location"); loc != "/ui/tasks?status=DEAD" {
			t.Fatalf("Location %q, want the list the action was sent from", loc)
		}
		want(t, c.get(p.header.Get("Location")), 200, msg)
	}
	wantStatus := func(id task.Task, st task.State) {
		t.Helper()
		if s := b.status(t, id.ID); s != st {
			t.Fatalf("task %s is %s, want %s", id.ID, s, st)
		}
	}
	unchanged := func() {
		t.Helper()
		wantStatus(f.queued, task.Queued)
		wantStatus(f.delayed, task.Queued)
		wantStatus(f.dead, task.Dead)
		wantStatus(f.cancelled, task.Cancelled)
	}

	p := c.get("/ui/tasks")
	want(t, p, 200, `id="bulk"`, `id="bulk-confirm"`, `id="select-all"`, `name="id" value="`+dead+`" form="bulk"`,
		`<th>Due</th>`, `href="/ui/tasks?status=scheduled"`)
	if strings.Contains(p.body, " checked>") {
		t.Fatal("boxes ticked without ?select=all")
	}
	if n := strings.Count(c.get("/ui/tasks?select=all").body, " checked>"); n != 4 {
		t.Fatalf("?select=all ticks %d boxes, want the page's 4", n)
	}
	// The due column: the delayed task is due in about an hour, the
	// queued one now.
	want(t, p, 200, "in 59m", "<td class=\"due\">now</td>")

	// Refused: no confirmation, nothing ticked, a bad id, too many ids,
	// an unknown action, a cross-site request.
	flash(c.post("/ui/tasks/bulk", bulk("delete", false, dead)), "tick the confirmation box")
	flash(c.post("/ui/tasks/bulk", bulk("delete", true)), "no task selected")
	want(t, c.post("/ui/tasks/bulk", bulk("delete", true, dead, "not-a-uuid")), 400, `id &#34;not-a-uuid&#34; is not a task id`)
	many := make([]string, 51)
	for i := range many {
		many[i] = uuid.NewString()
	}
	want(t, c.post("/ui/tasks/bulk", bulk("delete", true, append(many, dead)...)), 400, "52 task ids in one request; at most 50")
	want(t, c.post("/ui/tasks/bulk", bulk("purge", true, dead)), 400, `action &#34;purge&#34; is not one of redrive, cancel, delete`)
	for _, hdr := range [][]string{{"Sec-Fetch-Site", "cross-site"}, {"Origin", "https://evil.example"}} {
		want(t, c.post("/ui/tasks/bulk", bulk("delete", true, dead, cancelled), hdr...), http.StatusForbidden, "cross-origin")
	}
	unchanged()

	// Delete: the finished ones go (with the dead one's DLQ entry), the
	// live one and an unknown id are refused.
	flash(c.post("/ui/tasks/bulk", bulk("delete", true, dead, cancelled, queued, uuid.NewString())),
		"2 tasks deleted; 2 refused: 1 still queued, 1 not found (only SUCCEEDED, DEAD and CANCELLED tasks can be deleted). 1 DLQ entry removed.")
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE id = ANY($1::uuid[])`, []string{dead, cancelled}); n != 0 {
		t.Fatalf("%d of the deleted tasks remain", n)
	}
	if n := b.dlqLen(t); n != 0 {
		t.Fatalf("%d DLQ entries after deleting the dead task", n)
	}
	wantStatus(f.queued, task.Queued)

	// Cancel with a reason, then again: refused, already cancelled.
	v := bulk("cancel", true, queued, delayed, queued)
	v.Set("reason", "batch withdrawn")
	flash(c.post("/ui/tasks/bulk", v), "2 tasks cancelled.")
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE id = ANY($1::uuid[]) AND status = 'CANCELLED' AND cancel_reason = 'batch withdrawn' AND cancel_requested_by = 'ui'`, []string{queued, delayed}); n != 2 {
		t.Fatalf("%d tasks cancelled with the reason, want 2", n)
	}
	flash(c.post("/ui/tasks/bulk", bulk("cancel", true, queued)),
		"0 tasks cancelled; 1 refused: already cancelled (only QUEUED, RETRYING and RUNNING tasks can be cancelled).")

	// Redrive them.
	flash(c.post("/ui/tasks/bulk", bulk("redrive", true, queued, delayed)), "2 tasks redriven. 0 DLQ entries removed.")
	wantStatus(f.queued, task.Queued)
	wantStatus(f.delayed, task.Queued)
	flash(c.post("/ui/tasks/bulk", bulk("redrive", true, queued)),
		"0 tasks redriven; 1 refused: queued (only DEAD and CANCELLED tasks can be redriven).")
}

// TestCancelNeedsConfirmation: the task page's cancel has a confirmation
// box; without it the task is left alone.
func TestCancelNeedsConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)
	id := f.queued.ID.String()
	want(t, c.get("/ui/tasks/"+id), 200, `action="/ui/tasks/`+id+`/cancel"`, `name="confirm" value="yes" required> stop it`)
	csrf := c.csrf("/ui/tasks/" + id)
	p := c.post("/ui/tasks/"+id+"/cancel", url.Values{"csrf": {csrf}})
	want(t, p, 303)
	want(t, c.get(p.header.Get("Location")), 200, "Not cancelled: tick the confirmation box first.")
	if s := b.status(t, f.queued.ID); s != task.Queued {
		t.Fatalf("an unconfirmed cancel left the task %s", s)
	}
	want(t, c.post("/ui/tasks/"+id+"/cancel", url.Values{"csrf": {csrf}, "confirm": {"yes"}}), 303)
	if s := b.status(t, f.queued.ID); s != task.Cancelled {
		t.Fatalf("a confirmed cancel left the task %s", s)
	}
}

// TestScheduledFilter: the tasks page's "scheduled" filter lists the
// waiting tasks due later, not those due now nor finished ones.
func TestScheduledFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	f := b.fixture(t)
	c := b.client(t)
	p := c.get("/ui/tasks?status=scheduled")
	want(t, p, 200, f.delayed.ID.String(), `<option value="SCHEDULED" selected>`)
	for _, other := range []task.Task{f.queued, f.dead, f.cancelled} {
		if strings.Contains(p.body, other.ID.String()) {
			t.Fatalf("the scheduled filter lists %s task %s", other.Status, other.ID)
		}
	}
	want(t, c.get("/ui/tasks?status=later"), 400, "scheduled")
}

// count runs a count(*) query.
func (b *bundle) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
