package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
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

	// End the tasks in flight before they run (the end of a run hands
	// its room on at once: TestGroupWindowRefilledByEnd): every window is
	// free for the release.
	for _, tk := range append(append(append(big[:w:w], quiet...), mid[:w]...), plain...) {
		if _, err := b.store.Cancel(b.ctx, "test", "", tk.ID); err != nil {
			t.Fatal(err)
		}
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
	started, createdParked := map[string]int{}, map[string]int{}
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
		case task.Parked:
			createdParked[group[r.ID]]++
		default:
			t.Errorf("task %s: outcome %s", r.ID, r.Outcome)
		}
	}
	if total != capN || started["a"] != 2 || started["b"] != 2 || started["c"] != 1 {
		t.Errorf("started %v (%d in all), want a:2 b:2 c:1 (the kind's 5)", started, total)
	}
	// A group's window is at most its concurrency per group: each named
	// group's tasks beyond 2 were created parked (the tasks without a
	// group have no window).
	if len(createdParked) != 3 || createdParked["a"] != 2 || createdParked["b"] != 2 || createdParked["c"] != 2 {
		t.Errorf("created parked by their windows: %v, want a:2 b:2 c:2", createdParked)
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

// TestGroupWeights: a group of weight 3 has three times the window of a
// group of weight 1 and three turns in each round of a release; two
// groups kept busy through a FIFO stream (each run's end refilling its
// group's window) start about 3:1.
func TestGroupWeights(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	w := 2
	if _, err := b.store.SetKind(b.ctx, "test", "wf", task.KindUpdate{GroupWindow: &w, GroupWeights: map[string]int{"heavy": 3}}); err != nil {
		t.Fatal(err)
	}
	k, ok, err := b.store.Kind(b.ctx, "wf")
	if err != nil || !ok || len(k.GroupWeights) != 1 || k.GroupWeights["heavy"] != 3 {
		t.Fatalf("the kind's weights: %v (%v, %v), want heavy=3", k.GroupWeights, ok, err)
	}
	var audited int
	if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM ingest_kind_change WHERE kind = 'wf' AND group_weights = '{"heavy": 3}'`).Scan(&audited); err != nil || audited != 1 {
		t.Errorf("the change's audit row: %d (%v), want 1 with the weights", audited, err)
	}
	heavy, light := groupTasks(t, b, "wf", "heavy", 60), groupTasks(t, b, "wf", "light", 60)
	parked := func(ts []task.Task) (n int) {
		for _, tk := range ts {
			if tk.ParkedAt != nil {
				n++
			}
		}
		return n
	}
	if p, q := parked(heavy), parked(light); p != 60-3*w || q != 60-w {
		t.Errorf("created parked: heavy %d, light %d; want %d and %d (windows %d and %d)", p, q, 60-3*w, 60-w, 3*w, w)
	}
	group := map[uuid.UUID]string{}
	for _, tk := range heavy {
		group[tk.ID] = "heavy"
	}
	for _, tk := range light {
		group[tk.ID] = "light"
	}
	// A worker that takes the oldest entry of the stream (the task with
	// the oldest unsent outbox event), runs it and refills the windows.
	next := func() uuid.UUID {
		t.Helper()
		var id uuid.UUID
		if err := b.db.QueryRow(b.ctx, `SELECT o.task_id FROM outbox_event o JOIN ingest_task t ON t.id = o.task_id
			WHERE t.kind = 'wf' AND t.status = 'QUEUED' AND t.parked_at IS NULL ORDER BY o.id LIMIT 1`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	starts := map[string]int{}
	for range 40 {
		id := next()
		if _, err := b.store.Start(b.ctx, "w", time.Minute, id); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Succeed(b.ctx, "w", id); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.ReleaseParked(b.ctx, "wf", 0, 0); err != nil {
			t.Fatal(err)
		}
		starts[group[id]]++
	}
	if h, l := starts["heavy"], starts["light"]; l == 0 || float64(h)/float64(l) < 2 || float64(h)/float64(l) > 4.5 {
		t.Errorf("starts of 40: heavy %d, light %d; want about 3:1 (weights 3 and 1)", h, l)
	}

	// A release into empty windows takes 3 of heavy per 1 of light.
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET status = 'SUCCEEDED', finished_at = now() WHERE kind = 'wf' AND parked_at IS NULL AND finished_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	ids, err := b.store.ReleaseParked(b.ctx, "wf", 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, id := range ids {
		got[group[id]]++
	}
	if got["heavy"] != 3 || got["light"] != 1 {
		t.Errorf("a release of 4 into empty windows took %v, want heavy 3 and light 1 (one round)", got)
	}

	// Weight 1 removes a group's weight; other groups keep theirs.
	if _, err := b.store.SetKind(b.ctx, "test", "wf", task.KindUpdate{GroupWeights: map[string]int{"heavy": 1, "other": 2}}); err != nil {
		t.Fatal(err)
	}
	if k, _, err := b.store.Kind(b.ctx, "wf"); err != nil || len(k.GroupWeights) != 1 || k.GroupWeights["other"] != 2 {
		t.Errorf("after heavy=1 other=2: weights %v (%v), want other=2 only", k.GroupWeights, err)
	}
}

func TestGroupWeightsValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	many := map[string]int{}
	for range task.MaxWeightedGroups + 1 {
		many[uuid.NewString()] = 2
	}
	for _, c := range []struct {
		w    map[string]int
		want string
	}{
		{map[string]int{"a": 0}, "from 1 to 100"},
		{map[string]int{"a": 101}, "from 1 to 100"},
		{map[string]int{"": 2}, "empty"},
		{map[string]int{strings.Repeat("x", task.MaxGroupKeyLength+1): 2}, "longer than"},
		{map[string]int{"a\nb": 2}, "control"},
		{many, "at most"},
	} {
		_, err := b.store.SetKind(b.ctx, "test", "wv", task.KindUpdate{GroupWeights: c.w})
		var ferr *task.FieldError
		if !errors.As(err, &ferr) || ferr.Field != "group_weights" || !strings.Contains(ferr.Msg, c.want) {
			t.Errorf("weights of %d groups: %v, want an error on group_weights saying %q", len(c.w), err, c.want)
		}
	}
}

// TestGroupWindowRefilledByEnd: the statement that ends a run of a group
// hands its room in the group's window to the group's oldest parked task,
// in the same transaction, with an outbox event due now on the stream the
// ended run came from (the base stream, not the ended task's priority
// stream); a retry keeps its room, and a paused kind's end releases
// nothing (its resume does).
func TestGroupWindowRefilledByEnd(t *testing.T) {
	t.Parallel()
	const base = "fair:refill"
	b := setup(t, task.Config{Stream: base})
	w := 2
	if _, err := b.store.SetKind(b.ctx, "test", "rf", task.KindUpdate{GroupWindow: &w}); err != nil {
		t.Fatal(err)
	}
	nts := make([]task.NewTask, 6)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "rf", GroupKey: "big", Priority: 1, Payload: json.RawMessage(`{}`)}
	}
	res, err := b.store.CreateBatch(b.ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	parked := func(id uuid.UUID) bool { return isParked(t, b, id) }
	for i, id := range ids {
		if parked(id) != (i >= w) {
			t.Fatalf("task %d: parked %v, want %v", i, parked(id), i >= w)
		}
	}
	if _, err := b.store.Start(b.ctx, "w", time.Minute, ids[0], ids[1]); err != nil {
		t.Fatal(err)
	}
	// The first run's event was published to its priority's stream.
	if _, err := b.db.Exec(b.ctx, `UPDATE outbox_event SET status = 'SENT', sent_at = now(), stream_id = '1-0', stream = $2 WHERE task_id = $1`,
		ids[0], base+":p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Succeed(b.ctx, "w", ids[0]); err != nil {
		t.Fatal(err)
	}
	if parked(ids[2]) || !parked(ids[3]) {
		t.Fatalf("after a run's success: task 2 parked %v, task 3 parked %v; want the oldest parked one released, only it", parked(ids[2]), parked(ids[3]))
	}
	var stream string
	var due bool
	if err := b.db.QueryRow(b.ctx, `SELECT stream, next_retry_at <= now() FROM outbox_event WHERE task_id = $1 AND status = 'NEW'`, ids[2]).Scan(&stream, &due); err != nil {
		t.Fatalf("the released task's outbox event: %v", err)
	}
	if stream != base || !due {
		t.Errorf("the released task's outbox event: stream %q, due %v; want %q, due now", stream, due, base)
	}
	// A DEAD end refills too; a retry keeps its room.
	if _, err := b.store.Fail(b.ctx, "w", task.Failure{ID: ids[1], Error: "bad", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if parked(ids[3]) {
		t.Error("a DEAD end did not release the next parked task")
	}
	if _, err := b.store.Start(b.ctx, "w", time.Minute, ids[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Fail(b.ctx, "w", task.Failure{ID: ids[2], Error: "again"}); err != nil {
		t.Fatal(err)
	}
	if !parked(ids[4]) {
		t.Error("a retry released a parked task: its entry stays in the window")
	}
	// A paused kind's end releases nothing.
	if _, err := b.store.Start(b.ctx, "w", time.Minute, ids[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SetPaused(b.ctx, "test", "rf", true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Succeed(b.ctx, "w", ids[3]); err != nil {
		t.Fatal(err)
	}
	if !parked(ids[4]) {
		t.Error("the end of a run of a paused kind released a parked task")
	}
}

// isParked reports whether task id is parked.
func isParked(t *testing.T, b *bundle, id uuid.UUID) bool {
	t.Helper()
	var p bool
	if err := b.db.QueryRow(b.ctx, `SELECT parked_at IS NOT NULL FROM ingest_task WHERE id = $1`, id).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGroupLimitRefilledByEnd: for a kind whose only limit is
// concurrency_per_group, the statement that ends a run refills its
// group's window as for a kind without limits (migration 00036): the
// group's oldest parked task is released with its outbox row, and the
// worker's free of the run's slot that follows releases nothing past the
// window. A kind with a limit of its own is still left to its releases.
func TestGroupLimitRefilledByEnd(t *testing.T) {
	t.Parallel()
	b := perGroupAndOwnLimits(t)
	parked := func(id uuid.UUID) bool { return isParked(t, b, id) }
	for _, c := range []struct {
		kind   string
		refill bool
	}{{"pg", true}, {"own", false}} {
		ts := groupTasks(t, b, c.kind, "a", 3)
		if parked(ts[0].ID) || !parked(ts[1].ID) || !parked(ts[2].ID) {
			t.Fatalf("kind %s: a window of 1 (concurrency_per_group 1) did not park the second and third tasks", c.kind)
		}
		if rs, err := b.store.StartLimited(b.ctx, "w", time.Minute, c.kind, ts[0].ID); err != nil || rs[0].Outcome != task.Started {
			t.Fatalf("kind %s: start: %v %v", c.kind, rs, err)
		}
		if _, err := b.store.Succeed(b.ctx, "w", ts[0].ID); err != nil {
			t.Fatal(err)
		}
		if got := !parked(ts[1].ID); got != c.refill {
			t.Errorf("kind %s: the end of a run released the group's next task: %v, want %v", c.kind, got, c.refill)
		}
		var events int
		if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM outbox_event WHERE task_id = $1 AND status = 'NEW'`, ts[1].ID).Scan(&events); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 1, false: 0}[c.refill]; events != want {
			t.Errorf("kind %s: the next task has %d new outbox rows, want %d", c.kind, events, want)
		}
		if !c.refill {
			continue
		}
		if _, err := b.store.FreeSlots(b.ctx, c.kind, ts[0].ID); err != nil {
			t.Fatal(err)
		}
		if !parked(ts[2].ID) {
			t.Errorf("kind %s: the free after the refill released a task past the group's window", c.kind)
		}
	}
}

// perGroupAndOwnLimits returns a bundle with two kinds: pg, whose only
// limit is per group (concurrency_per_group 1), and own, with a
// concurrency of its own as well (1 and 1).
func perGroupAndOwnLimits(t *testing.T) *bundle {
	t.Helper()
	b := setup(t, task.Config{})
	one := 1
	if _, err := b.store.SetKind(b.ctx, "test", "pg", task.KindUpdate{ConcurrencyPerGroup: &one}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SetKind(b.ctx, "test", "own", task.KindUpdate{Concurrency: &one, ConcurrencyPerGroup: &one}); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGroupOnlyLimitsLockByGroup: the starts of a kind whose only limits
// are per group take their groups' start locks, not the kind's row: with
// a release of the kind under way (its row locked as a release locks it)
// and a start of group a under way (a's start lock held), b's task starts
// at once and a's waits for a's lock. A kind with a limit of its own
// still waits for its row, and so does a kind with per-group limits only
// while its row is locked as an earlier version's start locked it.
func TestGroupOnlyLimitsLockByGroup(t *testing.T) {
	t.Parallel()
	b := perGroupAndOwnLimits(t)
	ta, tb := groupTasks(t, b, "pg", "a", 1)[0], groupTasks(t, b, "pg", "b", 1)[0]
	to := groupTasks(t, b, "own", "a", 1)[0]

	tx, err := b.db.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	for _, q := range [][]any{
		{task.LockReleaseSQL, "own"}, {task.LockReleaseSQL, "pg"}, // releases of both kinds under way
		{`SELECT pg_advisory_xact_lock(hashtextextended('ingest-start/pg/a', 0))`},
	} {
		if _, err := tx.Exec(b.ctx, q[0].(string), q[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	res, err := b.store.StartLimited(ctx, "w", time.Minute, "pg", tb.ID)
	if err != nil {
		t.Fatalf("group b's start waited for the kind's row or another group's lock: %v", err)
	}
	if res[0].Outcome != task.Started {
		t.Fatalf("group b's task: %s, want started", res[0].Outcome)
	}

	type result struct {
		res []task.StartResult
		err error
	}
	start := func(kind string, id uuid.UUID) chan result {
		ch := make(chan result, 1)
		go func() {
			res, err := b.store.StartLimited(ctx, "w", time.Minute, kind, id)
			ch <- result{res, err}
		}()
		return ch
	}
	waiting := func(event string) int {
		var n int
		if err := b.db.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = ANY($1)`,
			strings.Split(event, ",")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	aDone := start("pg", ta.ID)
	testenv.Eventually(t, 30*time.Second, "group a's start waiting for a's start lock", func() bool { return waiting("advisory") == 1 })
	ownDone := start("own", to.ID)
	testenv.Eventually(t, 30*time.Second, "the start of a kind with a limit of its own waiting for the kind's row", func() bool {
		return waiting("tuple,transactionid") == 1
	})
	for name, ch := range map[string]chan result{"group a's start": aDone, "the start of kind own": ownDone} {
		select {
		case r := <-ch:
			t.Fatalf("%s did not wait for the lock held: %+v", name, r)
		default:
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan result{"group a's task": aDone, "kind own's task": ownDone} {
		r := <-ch
		if r.err != nil {
			t.Fatalf("%s: %v", name, r.err)
		}
		if r.res[0].Outcome != task.Started {
			t.Errorf("%s: %s, want started once the locks were free", name, r.res[0].Outcome)
		}
	}

	// An earlier version's start of the kind holds its row FOR UPDATE.
	tc := groupTasks(t, b, "pg", "c", 1)[0]
	old, err := b.db.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.Rollback(b.ctx) }()
	if _, err := old.Exec(b.ctx, `SELECT 1 FROM ingest_kind WHERE kind = 'pg' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	cDone := start("pg", tc.ID)
	testenv.Eventually(t, 30*time.Second, "group c's start waiting for the kind's row an earlier version's start holds", func() bool {
		return waiting("tuple,transactionid") == 1
	})
	select {
	case r := <-cDone:
		t.Fatalf("group c's start did not wait for the row lock of an earlier version's start: %+v", r)
	default:
	}
	if err := old.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-cDone; r.err != nil || r.res[0].Outcome != task.Started {
		t.Errorf("group c's task once the row was free: %+v", r)
	}
}

// TestReserveNeedsTheLocksItsLimitsNeed: a reservation reserves nothing
// under the locks of a kind with per-group limits only (its groups') when
// the kind it reads has a limit of its own (its limits changed between
// the locks and the reservation), and reserves under the kind's row lock
// or, for a kind with per-group limits only, under its groups' locks.
func TestReserveNeedsTheLocksItsLimitsNeed(t *testing.T) {
	t.Parallel()
	b := perGroupAndOwnLimits(t)
	tasks := map[string]uuid.UUID{"pg": groupTasks(t, b, "pg", "a", 1)[0].ID, "own": groupTasks(t, b, "own", "a", 1)[0].ID}
	for _, c := range []struct {
		kind, locks string
		want        int
	}{{"own", "groups", 0}, {"own", "", 0}, {"pg", "", 0}, {"own", "kind", 1}, {"pg", "groups", 1}, {"pg", "kind", 1}} {
		tx, err := b.db.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		var chosen []uuid.UUID
		var found, limited, rated bool
		var slots, other []uuid.UUID
		if _, err := tx.Exec(b.ctx, `SELECT set_config($1, $2, true)`, task.StartLockSetting, c.locks); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(b.ctx, task.ReserveSQL, c.kind, []uuid.UUID{tasks[c.kind]}, 1000, false).
			Scan(&found, &limited, &rated, &chosen, &slots, &other); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(b.ctx)
		if len(chosen) != c.want {
			t.Errorf("kind %s under the locks %q: %d reserved, want %d", c.kind, c.locks, len(chosen), c.want)
		}
	}
}

// TestReserveSkipsSlotsBeingFreed: a start's reservation deletes the
// stale slot rows of its kind and groups without waiting for a
// transaction that is deleting the same rows (a worker's FreeSlots),
// which could otherwise close a deadlock with it: with a stale slot row
// of group a locked by an open delete, a task of group a still starts at
// once, for a kind with per-group limits only and for one with a limit
// of its own.
func TestReserveSkipsSlotsBeingFreed(t *testing.T) {
	t.Parallel()
	b := perGroupAndOwnLimits(t)
	for _, kind := range []string{"pg", "own"} {
		// The stale rows are those of a run that ended and whose worker
		// is freeing them.
		stale := groupTasks(t, b, kind, "a", 1)[0].ID
		if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET status = 'SUCCEEDED', finished_at = now() WHERE id = $1`, stale); err != nil {
			t.Fatal(err)
		}
		next := groupTasks(t, b, kind, "a", 1)[0].ID
		for _, q := range []string{
			`INSERT INTO ingest_group_slot (kind, group_key, task_id, reserved_at) VALUES ($1, 'a', $2, now() - interval '1 hour')`,
			`INSERT INTO ingest_kind_slot (kind, task_id, reserved_at) VALUES ($1, $2, now() - interval '1 hour')`,
		} {
			if _, err := b.db.Exec(b.ctx, q, kind, stale); err != nil {
				t.Fatal(err)
			}
		}
		tx, err := b.db.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(b.ctx) }() // should the test fail before the rollback below
		for _, q := range []string{
			`DELETE FROM ingest_group_slot WHERE kind = $1 AND task_id = $2`,
			`DELETE FROM ingest_kind_slot WHERE kind = $1 AND task_id = $2`,
		} {
			if _, err := tx.Exec(b.ctx, q, kind, stale); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
		rs, err := b.store.StartLimited(ctx, "w", time.Minute, kind, next)
		cancel()
		_ = tx.Rollback(b.ctx)
		if err != nil {
			t.Fatalf("kind %s: a start waited for the rows being freed: %v", kind, err)
		}
		if len(rs) != 1 || rs[0].Outcome != task.Started {
			t.Errorf("kind %s: the start beside a stale slot row being freed: %+v, want started", kind, rs)
		}
	}
}

// TestGroupRefillLocksTheOutboxBeforeReadingIt: the refill at a run's
// end takes its write lock of outbox_event before it reads the table, so
// that an extension of the outbox partitions (SHARE on the table, then
// the DEFAULT partition for the attach) never deadlocks with it: with
// SHARE held, an end that refills a window waits without holding any
// partition, the DEFAULT partition's ACCESS EXCLUSIVE lock is granted,
// and once the extension commits the end goes on and refills.
func TestGroupRefillLocksTheOutboxBeforeReadingIt(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	w := 1
	if _, err := b.store.SetKind(b.ctx, "test", "rl", task.KindUpdate{GroupWindow: &w}); err != nil {
		t.Fatal(err)
	}
	ts := groupTasks(t, b, "rl", "g", 2)
	if !isParked(t, b, ts[1].ID) {
		t.Fatal("a window of 1 did not park the group's second task")
	}
	// The run's end as its audit row records it (the trigger's input),
	// without the store's retry of a statement a deadlock aborted.
	if err := testenv.DuringOutboxExtension(t, b.db, func() error {
		_, err := b.db.Exec(b.ctx, `INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, worker)
			VALUES ($1, 'RUNNING', 'SUCCEEDED', 1, 'w')`, ts[0].ID)
		return err
	}); err != nil {
		t.Fatalf("the end: %v", err)
	}
	if isParked(t, b, ts[1].ID) {
		t.Error("the end did not refill the group's window")
	}
}
