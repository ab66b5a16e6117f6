package task_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// seqEdges returns the 'sequence' edges of kind's tasks as task -> the
// task it follows.
func (b *bundle) seqEdges(t *testing.T, kind string) map[uuid.UUID]uuid.UUID {
	t.Helper()
	rows, err := b.db.Query(b.ctx, `SELECT d.task_id, d.depends_on FROM ingest_task_dependency d
		JOIN ingest_task t ON t.id = d.task_id WHERE d.reason = 'sequence' AND t.kind = $1`, kind)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uuid.UUID]uuid.UUID{}
	for rows.Next() {
		var a, p uuid.UUID
		if err := rows.Scan(&a, &p); err != nil {
			t.Fatal(err)
		}
		out[a] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// heldWithoutOutbox reports whether id is held (waiting_for > 0) and has
// no outbox row but the held one (due at task.HeldUntil).
func (b *bundle) heldWithoutOutbox(t *testing.T, id uuid.UUID) bool {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM ingest_task WHERE id = $1 AND waiting_for > 0`, id) == 1 &&
		b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND (next_retry_at IS NULL OR next_retry_at < $2)`, id, task.HeldUntil) == 0
}

// TestSequenceCreate: the first task of a key runs free; each later one
// follows the one before it (one edge, held, no outbox row), numbered in
// creation order; items of one batch chain in batch order; other keys and
// kinds are sequences of their own; a key after a SUCCEEDED or CANCELLED
// latest task runs free.
func TestSequenceCreate(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	first := b.create(t, task.NewTask{Kind: "seq", SequenceKey: "doc-1"})
	if first.SequenceKey != "doc-1" || first.SequenceNo == nil || *first.SequenceNo != 1 {
		t.Fatalf("first task: sequence %q no %v, want doc-1 no 1", first.SequenceKey, first.SequenceNo)
	}
	if b.heldWithoutOutbox(t, first.ID) {
		t.Fatal("the first task of a key is held")
	}
	second := b.create(t, task.NewTask{Kind: "seq", SequenceKey: "doc-1"})
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "seq", Payload: json.RawMessage(`3`), SequenceKey: "doc-1"},
		{Kind: "seq", Payload: json.RawMessage(`1`), SequenceKey: "doc-2"},
		{Kind: "seq", Payload: json.RawMessage(`4`), SequenceKey: "doc-1"},
		{Kind: "other", Payload: json.RawMessage(`1`), SequenceKey: "doc-1"},
		{Kind: "seq", Payload: json.RawMessage(`0`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	third, fourth := res[0].Task, res[2].Task
	want := map[uuid.UUID]uuid.UUID{second.ID: first.ID, third.ID: second.ID, fourth.ID: third.ID}
	if got := b.seqEdges(t, "seq"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("edges = %v, want %v", got, want)
	}
	for i, tk := range []task.Task{second, third, fourth} {
		if !b.heldWithoutOutbox(t, tk.ID) {
			t.Errorf("task %d of doc-1 is not held without an outbox row", i+2)
		}
		if tk.SequenceNo == nil || *tk.SequenceNo != int64(i+2) {
			t.Errorf("task %d of doc-1: sequence_no %v", i+2, tk.SequenceNo)
		}
	}
	for _, r := range []task.CreateResult{res[1], res[3], res[4]} {
		if b.heldWithoutOutbox(t, r.Task.ID) {
			t.Errorf("task %s (kind %s, key %q) is held: it is first in its sequence", r.Task.ID, r.Task.Kind, r.Task.SequenceKey)
		}
	}
	if res[4].Task.SequenceNo != nil || res[4].Task.SequenceKey != "" {
		t.Errorf("a task without a key has sequence %q no %v", res[4].Task.SequenceKey, res[4].Task.SequenceNo)
	}

	// A key whose latest task succeeded, or was cancelled, runs free.
	b.start(t, "w", time.Minute, res[1].Task.ID, task.Started)
	if r, err := b.store.Succeed(b.ctx, "w", res[1].Task.ID); err != nil || !r[0].Applied {
		t.Fatalf("Succeed = %+v, %v", r, err)
	}
	if next := b.create(t, task.NewTask{Kind: "seq", SequenceKey: "doc-2"}); b.heldWithoutOutbox(t, next.ID) || *next.SequenceNo != 2 {
		t.Errorf("after a success: held %v, no %d; want free, 2", b.heldWithoutOutbox(t, next.ID), *next.SequenceNo)
	}
	lone := b.create(t, task.NewTask{Kind: "seq", SequenceKey: "doc-3", RunAt: time.Now().Add(time.Hour)})
	if _, err := b.store.Cancel(b.ctx, "op", "not needed", lone.ID); err != nil {
		t.Fatal(err)
	}
	if next := b.create(t, task.NewTask{Kind: "seq", SequenceKey: "doc-3"}); b.heldWithoutOutbox(t, next.ID) {
		t.Error("a task after a cancelled one is held")
	}
}

// TestSequenceKeyValidation: a bad key is refused naming sequence_key.
func TestSequenceKeyValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	for name, key := range map[string]string{
		"too long": strings.Repeat("k", task.MaxSequenceKeyLength+1),
		"control":  "a\x00b",
		"utf8":     "\xff",
	} {
		_, err := b.store.Create(b.ctx, task.NewTask{Kind: "seq", Payload: json.RawMessage(`1`), SequenceKey: key})
		var ferr *task.FieldError
		if !errors.As(err, &ferr) || ferr.Field != "sequence_key" || !errors.Is(err, task.ErrInvalidTask) {
			t.Errorf("%s: Create = %v, want a FieldError on sequence_key", name, err)
		}
	}
	if _, err := b.store.Create(b.ctx, task.NewTask{Kind: "seq", Payload: json.RawMessage(`1`),
		SequenceKey: strings.Repeat("k", task.MaxSequenceKeyLength)}); err != nil {
		t.Errorf("a key of the longest length: %v", err)
	}
}

// TestSequenceConcurrentCreates: many goroutines creating tasks of one
// key at once (each on its own connection) chain them into one line:
// numbers 1..n, each task but the first following the one numbered
// before it.
func TestSequenceConcurrentCreates(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	const goroutines, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				nts := []task.NewTask{{Kind: "seq", Payload: json.RawMessage(fmt.Sprint(i)), SequenceKey: "one"}}
				if i%3 == 0 { // some batches of two, and another key in between
					nts = append(nts, task.NewTask{Kind: "seq", Payload: json.RawMessage(`0`), SequenceKey: "two"},
						task.NewTask{Kind: "seq", Payload: json.RawMessage(fmt.Sprint(i)), SequenceKey: "one"})
				}
				if _, err := b.store.CreateBatch(b.ctx, nts); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, key := range []string{"one", "two"} {
		byNo := map[int64]uuid.UUID{}
		rows, err := b.db.Query(b.ctx, `SELECT id, sequence_no FROM ingest_task WHERE kind = 'seq' AND sequence_key = $1`, key)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			var id uuid.UUID
			var no int64
			if err := rows.Scan(&id, &no); err != nil {
				t.Fatal(err)
			}
			if _, dup := byNo[no]; dup {
				t.Fatalf("key %s: two tasks numbered %d", key, no)
			}
			byNo[no] = id
			n++
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		edges := b.seqEdges(t, "seq")
		for no := int64(1); no <= int64(n); no++ {
			id, ok := byNo[no]
			if !ok {
				t.Fatalf("key %s: %d tasks, none numbered %d", key, n, no)
			}
			p, has := edges[id]
			switch {
			case no == 1 && has:
				t.Errorf("key %s: the first task follows %s", key, p)
			case no > 1 && p != byNo[no-1]:
				t.Errorf("key %s: task %d follows %s, want task %d (%s)", key, no, p, no-1, byNo[no-1])
			}
		}
	}
}

// seqLine creates n tasks of kind and key and returns them in order.
func (b *bundle) seqLine(t *testing.T, kind, key string, n int) []task.Task {
	t.Helper()
	out := make([]task.Task, n)
	for i := range out {
		out[i] = b.create(t, task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprint(i)), SequenceKey: key})
	}
	return out
}

// free reports whether id is free to run: not held, with a due outbox row.
func (b *bundle) free(t *testing.T, id uuid.UUID) bool {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM ingest_task WHERE id = $1 AND coalesce(waiting_for, 0) = 0`, id) == 1 &&
		b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND status IN ('NEW', 'RETRYING') AND next_retry_at < $2`, id, task.HeldUntil) == 1
}

// TestSequenceRelease: a held task is refused by the start guard; each
// success releases the next task only; a DEAD task blocks its key (listed
// as blocked, counted by its kind) until redriven and succeeded, or
// deleted; a cancelled task in the middle passes its hold on; under
// "continue" a DEAD task releases the next one, and switching a kind to
// "continue" releases the sequences its DEAD tasks block.
func TestSequenceRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})

	t.Run("SuccessReleasesTheNextOnly", func(t *testing.T) {
		l := b.seqLine(t, "seq", "ok", 3)
		b.start(t, "w", time.Minute, l[1].ID, task.Held)
		b.runOK(t, l[0].ID, "")
		if !b.free(t, l[1].ID) || b.free(t, l[2].ID) {
			t.Fatalf("after the first success: second free %v, third free %v; want true, false", b.free(t, l[1].ID), b.free(t, l[2].ID))
		}
		b.runOK(t, l[1].ID, "")
		b.runOK(t, l[2].ID, "")
	})

	t.Run("DeadBlocksUntilRedriven", func(t *testing.T) {
		l := b.seqLine(t, "seq", "dead", 3)
		b.runDead(t, l[0].ID)
		if b.free(t, l[1].ID) {
			t.Fatal("a DEAD task released its successor under block")
		}
		later := b.create(t, task.NewTask{Kind: "seq", Payload: json.RawMessage(`9`), SequenceKey: "dead"})
		if !b.heldWithoutOutbox(t, later.ID) {
			t.Error("a task created behind a blocked sequence is not held")
		}
		blocked, err := b.store.BlockedSequences(b.ctx, "seq", 10)
		if err != nil || len(blocked) != 1 || blocked[0].TaskID != l[0].ID || blocked[0].SequenceKey != "dead" || blocked[0].Waiting != 3 {
			t.Fatalf("BlockedSequences = %+v, %v; want the DEAD task with 3 waiting", blocked, err)
		}
		if k, _, err := b.store.Kind(b.ctx, "seq"); err != nil || k.BlockedSequences != 1 || k.SequenceOnFailure != task.SequenceBlock {
			t.Errorf("Kind = %+v, %v; want 1 blocked sequence under block", k, err)
		}
		if r, err := b.store.Redrive(b.ctx, "op", l[0].ID); err != nil || !r[0].Applied {
			t.Fatalf("Redrive = %+v, %v", r, err)
		}
		if b.free(t, l[1].ID) {
			t.Fatal("a redrive alone released the successor")
		}
		b.runOK(t, l[0].ID, "")
		if !b.free(t, l[1].ID) || b.free(t, l[2].ID) {
			t.Fatal("the redriven task's success did not release the next task only")
		}
		if blocked, _ := b.store.BlockedSequences(b.ctx, "seq", 10); len(blocked) != 0 {
			t.Errorf("still blocked: %+v", blocked)
		}
	})

	t.Run("DeadDeletedReleases", func(t *testing.T) {
		l := b.seqLine(t, "seq", "deleted", 2)
		b.runDead(t, l[0].ID)
		if r, err := b.store.Delete(b.ctx, l[0].ID); err != nil || !r.Deleted {
			t.Fatalf("Delete = %+v, %v", r, err)
		}
		if !b.free(t, l[1].ID) {
			t.Fatal("deleting the DEAD head did not release the next task")
		}
	})

	t.Run("CancelInTheMiddlePassesTheHoldOn", func(t *testing.T) {
		l := b.seqLine(t, "seq", "cancel", 4)
		b.start(t, "w", time.Minute, l[0].ID, task.Started)
		if _, err := b.store.Cancel(b.ctx, "op", "not needed", l[1].ID); err != nil {
			t.Fatal(err)
		}
		if b.free(t, l[2].ID) {
			t.Fatal("cancelling the second task released the third while the first runs")
		}
		if r, err := b.store.Succeed(b.ctx, "w", l[0].ID); err != nil || !r[0].Applied {
			t.Fatalf("Succeed = %+v, %v", r, err)
		}
		if !b.free(t, l[2].ID) || b.free(t, l[3].ID) {
			t.Fatal("the first task's success did not release the third only")
		}
		// A task created now follows the fourth, not the cancelled one.
		next := b.create(t, task.NewTask{Kind: "seq", Payload: json.RawMessage(`5`), SequenceKey: "cancel"})
		if p := b.seqEdges(t, "seq")[next.ID]; p != l[3].ID {
			t.Errorf("new task follows %s, want the fourth %s", p, l[3].ID)
		}
	})

	t.Run("Continue", func(t *testing.T) {
		cont := task.SequenceContinue
		if _, err := b.store.SetKind(b.ctx, "op", "cont", task.KindUpdate{SequenceOnFailure: &cont}); err != nil {
			t.Fatal(err)
		}
		l := b.seqLine(t, "cont", "k", 2)
		b.runDead(t, l[0].ID)
		if !b.free(t, l[1].ID) {
			t.Fatal("under continue a DEAD task did not release the next one")
		}
		if blocked, _ := b.store.BlockedSequences(b.ctx, "cont", 10); len(blocked) != 0 {
			t.Errorf("blocked under continue: %+v", blocked)
		}
		// A task after a DEAD latest one runs free under continue.
		b.runDead(t, l[1].ID)
		if next := b.create(t, task.NewTask{Kind: "cont", Payload: json.RawMessage(`2`), SequenceKey: "k"}); !b.free(t, next.ID) {
			t.Error("a task after a DEAD one is held under continue")
		}
	})

	t.Run("SwitchToContinueReleases", func(t *testing.T) {
		l := b.seqLine(t, "switch", "k", 2)
		b.runDead(t, l[0].ID)
		if b.free(t, l[1].ID) {
			t.Fatal("released under block")
		}
		cont := task.SequenceContinue
		if _, err := b.store.SetKind(b.ctx, "op", "switch", task.KindUpdate{SequenceOnFailure: &cont}); err != nil {
			t.Fatal(err)
		}
		if !b.free(t, l[1].ID) {
			t.Fatal("switching the kind to continue did not release the sequence its DEAD task blocked")
		}
		if n := b.count(t, `SELECT count(*) FROM ingest_kind_change WHERE kind = 'switch' AND sequence_on_failure = 'continue' AND actor = 'op'`); n != 1 {
			t.Errorf("%d audit rows of the change, want 1", n)
		}
		bad := "skip"
		if _, err := b.store.SetKind(b.ctx, "op", "switch", task.KindUpdate{SequenceOnFailure: &bad}); !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), "sequence_on_failure") {
			t.Errorf("SetKind(skip) = %v, want a FieldError naming sequence_on_failure", err)
		}
	})
}

// TestSequenceCascadeCancelPassesTheHoldOn: two consecutive tasks of a
// key cancelled in one statement (the cascade of their dead dependency)
// leave the next task waiting for the running task before them.
func TestSequenceCascadeCancelPassesTheHoldOn(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	dep := b.create(t, task.NewTask{Kind: "dep"})
	first := b.create(t, task.NewTask{Kind: "seq", SequenceKey: "k"})
	res, err := b.store.CreateBatch(b.ctx, []task.NewTask{
		{Kind: "seq", Payload: json.RawMessage(`2`), SequenceKey: "k", DependsOn: []uuid.UUID{dep.ID}},
		{Kind: "seq", Payload: json.RawMessage(`3`), SequenceKey: "k", DependsOn: []uuid.UUID{dep.ID}},
		{Kind: "seq", Payload: json.RawMessage(`4`), SequenceKey: "k"},
	})
	if err != nil {
		t.Fatal(err)
	}
	last := res[2].Task
	b.start(t, "w", time.Minute, first.ID, task.Started)
	b.runDead(t, dep.ID)
	for _, r := range res[:2] {
		if st := b.get(t, r.Task.ID).Status; st != task.Cancelled {
			t.Fatalf("task %d: %s, want CANCELLED by its dead dependency", *r.Task.SequenceNo, st)
		}
	}
	if b.free(t, last.ID) {
		t.Fatal("the cascade released the task after the cancelled ones while the first runs")
	}
	if r, err := b.store.Succeed(b.ctx, "w", first.ID); err != nil || !r[0].Applied {
		t.Fatalf("Succeed = %+v, %v", r, err)
	}
	if !b.free(t, last.ID) {
		t.Fatal("the first task's success did not release the last one")
	}
}
