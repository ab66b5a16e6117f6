package task_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

func TestGroupKeyValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		key  string
		want string
	}{
		{"tenant-1", ""},
		{"", ""},
		{strings.Repeat("x", task.MaxGroupKeyLength+1), "longer than"},
		{"a\nb", "control"},
		{" a", "space"},
		{"\xff", "UTF-8"},
	} {
		ferr := task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), GroupKey: c.key}.Validate(1 << 20)
		switch {
		case c.want == "" && ferr != nil:
			t.Errorf("group_key %q: %v", c.key, ferr)
		case c.want != "" && (ferr == nil || ferr.Field != "group_key" || !strings.Contains(ferr.Msg, c.want)):
			t.Errorf("group_key %q: got %v, want an error on group_key saying %q", c.key, ferr, c.want)
		}
	}
	b := setup(t, task.Config{})
	_, err := b.store.Create(b.ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), GroupKey: "a\x00"})
	var ferr *task.FieldError
	if !errors.As(err, &ferr) || ferr.Field != "group_key" {
		t.Errorf("create with a NUL in group_key: %v, want a FieldError on group_key", err)
	}
}

// groupTasks creates n tasks of kind in group g, one batch.
func groupTasks(t *testing.T, b *bundle, kind, g string, n int) []task.Task {
	t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, GroupKey: g, Payload: json.RawMessage(`{}`)}
	}
	res, err := b.store.CreateBatch(b.ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]task.Task, n)
	for i, r := range res {
		out[i] = r.Task
	}
	return out
}

// TestGroupWindowHoldsBackAndReleasesRoundRobin: with a group window of
// 2, a group's tasks beyond 2 in flight are created parked without an
// outbox event; a task of another group is not held back; the releases
// serve the groups round-robin (one of each before a second of any), up
// to each group's window.
func TestGroupWindowHoldsBackAndReleasesRoundRobin(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	w := 2
	if _, err := b.store.SetKind(b.ctx, "test", "fair", task.KindUpdate{GroupWindow: &w}); err != nil {
		t.Fatal(err)
	}
	big := groupTasks(t, b, "fair", "big", 10)
	for i, tk := range big {
		if parked := tk.ParkedAt != nil; parked != (i >= w) {
			t.Errorf("big task %d: parked %v, want %v", i, parked, i >= w)
		}
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := b.db.QueryRow(b.ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`SELECT count(*) FROM outbox_event o JOIN ingest_task t ON t.id = o.task_id WHERE t.group_key = 'big'`); n != w {
		t.Errorf("%d outbox events of group big, want %d (its window)", n, w)
	}
	quiet := groupTasks(t, b, "fair", "quiet", 1)
	if quiet[0].ParkedAt != nil {
		t.Error("the first task of another group was held back")
	}
	mid := groupTasks(t, b, "fair", "mid", 5)
	plain := groupTasks(t, b, "fair", "", 5)
	for _, tk := range plain {
		if tk.ParkedAt != nil {
			t.Error("a task without a group was held back")
		}
	}

	// Run the tasks in flight to the end: every window is free.
	var live []uuid.UUID
	for _, tk := range append(append(append(big[:w:w], quiet...), mid[:w]...), plain...) {
		live = append(live, tk.ID)
	}
	if _, err := b.store.Start(b.ctx, "w", time.Minute, live...); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Succeed(b.ctx, "w", live...); err != nil {
		t.Fatal(err)
	}
	// A release of 2 takes one of each of the two groups with parked
	// tasks, not two of one.
	ids, err := b.store.ReleaseParked(b.ctx, "fair", 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]int{}
	for _, id := range ids {
		tk, err := b.store.Get(b.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		groups[tk.GroupKey]++
	}
	if len(ids) != 2 || groups["big"] != 1 || groups["mid"] != 1 {
		t.Errorf("a release of 2 released %v by group, want one of big and one of mid", groups)
	}
	// The rest of each window: one more of each.
	ids, err = b.store.ReleaseParked(b.ctx, "fair", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 {
		t.Errorf("released %d more, want 2 (each group's window full again)", len(ids))
	}
	for _, g := range []string{"big", "mid"} {
		if n := count(`SELECT count(*) FROM ingest_task WHERE group_key = $1 AND finished_at IS NULL AND parked_at IS NULL`, g); n != w {
			t.Errorf("group %s has %d tasks in flight, want its window %d", g, n, w)
		}
	}
	// A new task of a group with parked tasks waits behind them.
	if late := groupTasks(t, b, "fair", "mid", 1); late[0].ParkedAt == nil {
		t.Error("a new task of a group with parked tasks went ahead of them")
	}
	// Released tasks have an outbox event each, due now.
	if n := count(`SELECT count(*) FROM ingest_task t WHERE t.kind = 'fair' AND t.parked_at IS NULL AND t.finished_at IS NULL
		AND NOT EXISTS (SELECT 1 FROM outbox_event o WHERE o.task_id = t.id)`); n != 0 {
		t.Errorf("%d tasks in flight without an outbox event", n)
	}
}

// TestGroupLimitsStartLimited: under concurrency_per_group 2 and the
// kind's concurrency 5, one StartLimited call starts 2 of each group and
// 5 in all, in the batch's order, and parks the rest; a freed slot of a
// group releases a task of a group with room.
func TestGroupLimitsStartLimited(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	perGroup, capN, w := 2, 5, 1000
	if _, err := b.store.SetKind(b.ctx, "test", "gl", task.KindUpdate{ConcurrencyPerGroup: &perGroup, Concurrency: &capN, GroupWindow: &w}); err != nil {
		t.Fatal(err)
	}
	var audited int
	if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM ingest_kind_change WHERE kind = 'gl' AND actor = 'test'
		AND concurrency_per_group = 2 AND concurrency = 5 AND group_window = 1000 AND rate_per_group IS NULL`).Scan(&audited); err != nil || audited != 1 {
		t.Errorf("the change's audit rows: %d (%v), want 1", audited, err)
	}
	var ids []uuid.UUID
	group := map[uuid.UUID]string{}
	for _, g := range []string{"a", "b", "c", ""} {
		for _, tk := range groupTasks(t, b, "gl", g, 4) {
			ids = append(ids, tk.ID)
			group[tk.ID] = g
		}
	}
	res, err := b.store.StartLimited(b.ctx, "w", time.Minute, "gl", ids...)
	if err != nil {
		t.Fatal(err)
	}
	started := map[string]int{}
	var first uuid.UUID
	total := 0
	for _, r := range res {
		switch r.Outcome {
		case task.Started:
			started[group[r.ID]]++
			total++
			if first == uuid.Nil {
				first = r.ID
			}
		case task.ParkedAtLimit:
		default:
			t.Errorf("task %s: outcome %s", r.ID, r.Outcome)
		}
	}
	if total != capN || started["a"] != 2 || started["b"] != 2 || started["c"] != 1 {
		t.Errorf("started %v (%d in all), want a:2 b:2 c:1 (the kind's 5)", started, total)
	}
	// Group a's first run ends: its slot goes to a parked task of a group
	// with room (c or the tasks without a group), not to a's.
	if _, err := b.store.Succeed(b.ctx, "w", first); err != nil {
		t.Fatal(err)
	}
	woken, err := b.store.FreeSlots(b.ctx, "gl", first)
	if err != nil {
		t.Fatal(err)
	}
	if len(woken) != 1 {
		t.Fatalf("a freed slot released %d tasks, want 1", len(woken))
	}
	if g := group[woken[0]]; g == "b" {
		t.Errorf("a freed slot released a task of group %q, which is at its limit", g)
	}
}
