package task_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// runOK starts task id and completes it with result.
func (b *bundle) runOK(t *testing.T, id uuid.UUID, result string) {
	t.Helper()
	b.start(t, "w", time.Minute, id, task.Started)
	var r json.RawMessage
	if result != "" {
		r = json.RawMessage(result)
	}
	rs, err := b.store.SucceedWith(b.ctx, "w", task.Success{ID: id, Result: r})
	if err != nil || len(rs) != 1 || !rs[0].Applied {
		t.Fatalf("SucceedWith(%s) = %+v, %v", id, rs, err)
	}
}

// runDead starts task id and fails it permanently.
func (b *bundle) runDead(t *testing.T, id uuid.UUID) {
	t.Helper()
	b.start(t, "w", time.Minute, id, task.Started)
	if r := b.fail(t, "w", task.Failure{ID: id, Error: "boom", Permanent: true}); r.Status != task.Dead {
		t.Fatalf("Fail(%s) status %s, want DEAD", id, r.Status)
	}
}

// dueOutbox counts the unsent outbox rows of task id that are due by now
// (a held row is due at task.HeldUntil).
func (b *bundle) dueOutbox(t *testing.T, id uuid.UUID) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND status IN ('NEW', 'RETRYING') AND next_retry_at <= now()`, id)
}

// TestFanOutFanIn: a join that depends on 100 chunks is held, its stream
// entry (if one arrived) refused, until the last chunk ends; then it is
// published once and starts with the 100 results.
func TestFanOutFanIn(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	root := b.create(t, task.NewTask{Kind: "split"})
	nts := make([]task.NewTask, 0, 101)
	refs := make([]string, 100)
	for i := range 100 {
		refs[i] = fmt.Sprintf("chunk-%d", i)
		nts = append(nts, task.NewTask{Kind: "embed", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), Ref: refs[i], DependsOn: []uuid.UUID{root.ID}})
	}
	nts = append(nts, task.NewTask{Kind: "join", Payload: json.RawMessage(`{}`), DependsOnRefs: refs})
	res, err := b.store.CreateBatch(b.ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	join := res[100].Task
	if join.WaitingFor != 100 || join.DependencyDepth != 2 || join.WorkflowID == nil || *join.WorkflowID != root.ID {
		t.Fatalf("join = waiting %d depth %d workflow %v; want 100, 2, %s", join.WaitingFor, join.DependencyDepth, join.WorkflowID, root.ID)
	}
	if got := b.get(t, root.ID); got.WorkflowID == nil || *got.WorkflowID != root.ID {
		t.Fatalf("root workflow = %v, want its own id", got.WorkflowID)
	}
	// Held: a start (a stray stream entry) is refused.
	b.start(t, "w", time.Minute, join.ID, task.Held)
	b.start(t, "w", time.Minute, res[0].Task.ID, task.Held)
	if n := b.dueOutbox(t, join.ID); n != 0 {
		t.Fatalf("held join has %d due outbox rows", n)
	}
	b.runOK(t, root.ID, `{"chunks":100}`)
	for i := range 100 {
		id := res[i].Task.ID
		if n := b.dueOutbox(t, id); n != 1 {
			t.Fatalf("released chunk %d has %d due outbox rows, want 1", i, n)
		}
		if i < 99 {
			b.runOK(t, id, fmt.Sprintf(`{"chunk":%d}`, i))
			if got := b.get(t, join.ID); got.WaitingFor != 99-i {
				t.Fatalf("after chunk %d the join waits for %d, want %d", i, got.WaitingFor, 99-i)
			}
			continue
		}
		// The last chunk: the join is still held until it ends.
		b.start(t, "w", time.Minute, join.ID, task.Held)
		b.runOK(t, id, fmt.Sprintf(`{"chunk":%d}`, i))
	}
	if n := b.dueOutbox(t, join.ID); n != 1 {
		t.Fatalf("released join has %d due outbox rows, want 1", n)
	}
	if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, join.ID); n != 1 {
		t.Fatalf("released join has %d outbox rows, want 1 (its held row replaced)", n)
	}
	b.start(t, "w", time.Minute, join.ID, task.Started)
	results, err := b.store.DependencyResults(b.ctx, join.ID)
	if err != nil || len(results) != 100 {
		t.Fatalf("DependencyResults = %d results, %v; want 100", len(results), err)
	}
	for i := range 100 {
		if got, want := string(results[res[i].Task.ID]), fmt.Sprintf(`{"chunk": %d}`, i); got != want {
			t.Fatalf("result of chunk %d = %s, want %s", i, got, want)
		}
	}
	// It ran once: one start in its trail.
	starts := 0
	for _, r := range b.transitions(t, join.ID) {
		if r.To == string(task.Running) {
			starts++
		}
	}
	if starts != 1 {
		t.Fatalf("join started %d times, want 1", starts)
	}
}

// TestDeadDependencyCancels: a DEAD dependency cancels its dependents (and
// theirs, in the same transaction), with the audit message naming it; a
// dependent with OnFailureRun is released instead.
func TestDeadDependencyCancels(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	dep := b.create(t, task.NewTask{})
	other := b.create(t, task.NewTask{})
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "c", Payload: json.RawMessage(`1`), Ref: "c", DependsOn: []uuid.UUID{dep.ID, other.ID}},
		{Kind: "cc", Payload: json.RawMessage(`2`), DependsOnRefs: []string{"c"}},
		{Kind: "r", Payload: json.RawMessage(`3`), DependsOn: []uuid.UUID{dep.ID}, OnDependencyFailure: task.OnFailureRun},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, cc, r := res[0].Task, res[1].Task, res[2].Task
	b.runDead(t, dep.ID)
	for _, id := range []uuid.UUID{c.ID, cc.ID} {
		got := b.get(t, id)
		last := b.lastTransition(t, id)
		if got.Status != task.Cancelled || last.To != string(task.Cancelled) || last.Worker != task.DependencyCancelledBy {
			t.Fatalf("dependent %s: %s, last audit %+v; want CANCELLED by %s", id, got.Status, last, task.DependencyCancelledBy)
		}
		if id == c.ID && !strings.Contains(last.Message, dep.ID.String()) {
			t.Fatalf("audit message %q does not name the dependency %s", last.Message, dep.ID)
		}
		if id == cc.ID && !strings.Contains(last.Message, c.ID.String()) {
			t.Fatalf("audit message %q does not name the dependency %s", last.Message, c.ID)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id); n != 0 {
			t.Fatalf("cancelled dependent kept %d outbox rows", n)
		}
	}
	if got := b.get(t, r.ID); got.Status != task.Queued || got.WaitingFor != 0 || b.dueOutbox(t, r.ID) != 1 {
		t.Fatalf("run-anyway dependent: %s waiting %d; want QUEUED, released, published", got.Status, got.WaitingFor)
	}
	b.start(t, "w", time.Minute, r.ID, task.Started)
	// The other dependency's later success changes nothing for the
	// cancelled one.
	b.runOK(t, other.ID, "")
	if got := b.get(t, c.ID); got.Status != task.Cancelled {
		t.Fatalf("cancelled dependent is %s after its other dependency ended", got.Status)
	}
}

// TestCreateAfterDependencyEnded: a dependency that ended before the
// create counts at once: SUCCEEDED releases, DEAD cancels (or releases
// under OnFailureRun).
func TestCreateAfterDependencyEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	ok := b.create(t, task.NewTask{})
	b.runOK(t, ok.ID, `"done"`)
	dead := b.create(t, task.NewTask{})
	b.runDead(t, dead.ID)

	a := b.create(t, task.NewTask{DependsOn: []uuid.UUID{ok.ID}})
	if a.Status != task.Queued || a.WaitingFor != 0 || b.dueOutbox(t, a.ID) != 1 {
		t.Fatalf("dependent of a SUCCEEDED task: %s waiting %d", a.Status, a.WaitingFor)
	}
	c := b.create(t, task.NewTask{DependsOn: []uuid.UUID{ok.ID, dead.ID}})
	if c.Status != task.Cancelled || !strings.Contains(c.CancelReason, dead.ID.String()) {
		t.Fatalf("dependent of a DEAD task: %s (%q), want CANCELLED naming it", c.Status, c.CancelReason)
	}
	r := b.create(t, task.NewTask{DependsOn: []uuid.UUID{dead.ID}, OnDependencyFailure: task.OnFailureRun})
	if r.Status != task.Queued || r.WaitingFor != 0 || b.dueOutbox(t, r.ID) != 1 {
		t.Fatalf("run-anyway dependent of a DEAD task: %s waiting %d", r.Status, r.WaitingFor)
	}
}

// TestDependencyRejections: unknown and deleted ids, cycles, unknown and
// repeated refs, a bad policy and the fan-in limit are refused, naming the
// bad input, and nothing is created.
func TestDependencyRejections(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	gone := b.create(t, task.NewTask{})
	b.runOK(t, gone.ID, "")
	if _, err := b.store.Delete(b.ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	unknown := uuid.Must(uuid.NewV7())
	p := json.RawMessage(`{}`)
	many := make([]uuid.UUID, task.MaxDependencies+1)
	for i := range many {
		many[i] = uuid.Must(uuid.NewV7())
	}
	for _, c := range []struct {
		name string
		nts  []task.NewTask
		want string
	}{
		{"unknown", []task.NewTask{{Kind: "k", Payload: p, DependsOn: []uuid.UUID{unknown}}}, unknown.String()},
		{"deleted", []task.NewTask{{Kind: "k", Payload: p}, {Kind: "k", Payload: p, DependsOn: []uuid.UUID{gone.ID}}}, "task 1: depends_on: no task " + gone.ID.String()},
		{"cycle", []task.NewTask{
			{Kind: "k", Payload: p, Ref: "a", DependsOnRefs: []string{"c"}},
			{Kind: "k", Payload: p, Ref: "b", DependsOnRefs: []string{"a"}},
			{Kind: "k", Payload: p, Ref: "c", DependsOnRefs: []string{"b"}}}, "cycle: a -> c -> b -> a"},
		{"self", []task.NewTask{{Kind: "k", Payload: p, Ref: "a", DependsOnRefs: []string{"a"}}}, "cycle: a -> a"},
		{"unknown ref", []task.NewTask{{Kind: "k", Payload: p, DependsOnRefs: []string{"nope"}}}, `ref "nope" names no item`},
		{"repeated ref", []task.NewTask{{Kind: "k", Payload: p, Ref: "a"}, {Kind: "k", Payload: p, Ref: "a"}}, `ref "a" is also the ref of task 0`},
		{"policy", []task.NewTask{{Kind: "k", Payload: p, OnDependencyFailure: "maybe"}}, `on_dependency_failure must be "cancel" or "run", got "maybe"`},
		{"fan-in", []task.NewTask{{Kind: "k", Payload: p, DependsOn: many}}, "the limit is 1000"},
	} {
		_, err := b.store.CreateBatch(b.ctx, c.nts)
		var fe *task.FieldError
		if !errors.As(err, &fe) || !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v; want an invalid-task FieldError containing %q", c.name, err, c.want)
		}
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_task`); n != 0 {
		t.Fatalf("%d tasks left after refused creates", n)
	}
}

// TestDependencyDepth: a chain as deep as the limit is created and a
// death at its top cancels all of it in one transaction; one more level
// is refused.
func TestDependencyDepth(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	top := b.create(t, task.NewTask{})
	prev := top.ID
	var last task.Task
	for range task.MaxDependencyDepth {
		last = b.create(t, task.NewTask{DependsOn: []uuid.UUID{prev}})
		prev = last.ID
	}
	if last.DependencyDepth != task.MaxDependencyDepth {
		t.Fatalf("depth %d, want %d", last.DependencyDepth, task.MaxDependencyDepth)
	}
	_, err := b.store.Create(b.ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`1`), DependsOn: []uuid.UUID{prev}})
	if !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), "deep") {
		t.Fatalf("a chain one deeper: %v, want refused", err)
	}
	b.runDead(t, top.ID)
	if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE status = 'CANCELLED'`); n != task.MaxDependencyDepth {
		t.Fatalf("%d cancelled, want the whole chain of %d", n, task.MaxDependencyDepth)
	}
}

// TestCancelAndDeleteRelease: an operator's cancel of a dependency cancels
// its dependents; a sequence edge is released by a cancel and by the
// deletion of a DEAD predecessor, and held by its death.
func TestCancelAndDeleteRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	dep := b.create(t, task.NewTask{})
	d := b.create(t, task.NewTask{DependsOn: []uuid.UUID{dep.ID}})
	if _, err := b.store.Cancel(b.ctx, "op", "no", dep.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.get(t, d.ID); got.Status != task.Cancelled || !strings.Contains(got.CancelReason, "ended CANCELLED") {
		t.Fatalf("dependent of a cancelled task: %s %q", got.Status, got.CancelReason)
	}
	// Sequence edges, as the sequence feature writes them.
	pred := b.create(t, task.NewTask{})
	next := b.create(t, task.NewTask{})
	if _, err := b.db.Exec(b.ctx, `INSERT INTO ingest_task_dependency (task_id, depends_on, reason) VALUES ($1, $2, 'sequence')`, next.ID, pred.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET waiting_for = 1 WHERE id = $1`, next.ID); err != nil {
		t.Fatal(err)
	}
	b.runDead(t, pred.ID)
	if got := b.get(t, next.ID); got.Status != task.Queued || got.WaitingFor != 1 {
		t.Fatalf("successor of a DEAD predecessor: %s waiting %d; want held", got.Status, got.WaitingFor)
	}
	if _, err := b.store.Delete(b.ctx, pred.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.get(t, next.ID); got.WaitingFor != 0 || b.dueOutbox(t, next.ID) != 1 {
		t.Fatalf("successor of a deleted predecessor: waiting %d, %d due rows", got.WaitingFor, b.dueOutbox(t, next.ID))
	}
}

// TestRedriveWithDependents: redriving a DEAD dependency with its
// dependents revives those its death cancelled (and theirs), audited and
// held again; its success then runs them. A plain redrive leaves them.
func TestRedriveWithDependents(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	dep := b.create(t, task.NewTask{})
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "c", Payload: json.RawMessage(`1`), Ref: "c", DependsOn: []uuid.UUID{dep.ID}},
		{Kind: "cc", Payload: json.RawMessage(`2`), DependsOnRefs: []string{"c"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c, cc := res[0].Task, res[1].Task
	other := b.create(t, task.NewTask{Kind: "x"}) // cancelled by hand: not revived
	b.runDead(t, dep.ID)
	if _, err := b.store.Redrive(b.ctx, "op", dep.ID); err != nil {
		t.Fatal(err)
	}
	if got := b.get(t, c.ID); got.Status != task.Cancelled {
		t.Fatalf("a plain redrive revived the dependent: %s", got.Status)
	}
	b.runDead(t, dep.ID)
	if _, err := b.store.Cancel(b.ctx, "op", "", other.ID); err != nil {
		t.Fatal(err)
	}
	rs, revived, err := b.store.RedriveWithDependents(b.ctx, "op", dep.ID, other.ID)
	if err != nil || len(rs) != 2 || !rs[0].Applied || len(revived) != 2 {
		t.Fatalf("RedriveWithDependents = %+v, %v, %v; want the task redriven and 2 revived", rs, revived, err)
	}
	for _, id := range []uuid.UUID{c.ID, cc.ID} {
		got := b.get(t, id)
		last := b.lastTransition(t, id)
		if got.Status != task.Queued || got.WaitingFor != 1 || got.CancelReason != "" || last.From != string(task.Cancelled) ||
			!strings.HasPrefix(last.Message, task.RevivedMessage) || last.Worker != "op" {
			t.Fatalf("revived %s: %s waiting %d, last audit %+v", id, got.Status, got.WaitingFor, last)
		}
		b.start(t, "w", time.Minute, id, task.Held)
	}
	b.runOK(t, dep.ID, "")
	b.runOK(t, c.ID, "")
	b.runOK(t, cc.ID, "")
}

// TestRunNowRefusesHeld: run-now does not override dependencies, even for
// a delayed task: its held outbox row stays, and nothing changes.
func TestRunNowRefusesHeld(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	dep := b.create(t, task.NewTask{})
	held := b.create(t, task.NewTask{DependsOn: []uuid.UUID{dep.ID}, Delay: time.Hour})
	before := b.snapshot(t, held.ID)
	res, err := b.store.RunNow(b.ctx, "op", held.ID)
	if err != nil || res.Outcome != task.RunNowHeld || !strings.Contains(res.Refusal(held.ID), "dependencies") {
		t.Fatalf("RunNow = %+v, %v; want HELD", res, err)
	}
	if after := b.snapshot(t, held.ID); after != before {
		t.Fatalf("run-now changed a held task: %+v -> %+v", before, after)
	}
	b.runOK(t, dep.ID, "")
	// Released, and still delayed: its row is due at its run time.
	if got := b.get(t, held.ID); got.WaitingFor != 0 || b.dueOutbox(t, held.ID) != 0 {
		t.Fatalf("released delayed task: waiting %d, %d due rows; want 0 and none due yet", got.WaitingFor, b.dueOutbox(t, held.ID))
	}
	if res, err := b.store.RunNow(b.ctx, "op", held.ID); err != nil || res.Outcome != task.RunNowDone {
		t.Fatalf("RunNow after the release = %+v, %v; want DUE", res, err)
	}
}
