package maintenance_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

func (b *bundle) partitions(t *testing.T, cfg maintenance.PartitionsConfig) *maintenance.Partitions {
	t.Helper()
	p, err := maintenance.NewPartitions(cfg, b.db, b.reg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func listPartitions(t testing.TB, db *pgxpool.Pool) ([]transition.Partition, time.Time) {
	t.Helper()
	parts, now, err := transition.Partitions(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return parts, now
}

func partitionNames(parts []transition.Partition) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p.Name)
	}
	return out
}

// partitionOf returns the partition that holds the audit row id.
func partitionOf(t *testing.T, db *pgxpool.Pool, id int64) string {
	t.Helper()
	var name string
	if err := db.QueryRow(context.Background(), `SELECT tableoid::regclass::text FROM ingest_task_transition WHERE id = $1`, id).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// pastLayout replaces the partition of the rows from before the upgrade
// (empty in a test database) with past partitions of an hour each ending
// at the given offsets from now (e.g. -2h, -1h), and one from the last of
// them to the first partition the migration created ahead; it returns the
// names of the past ones, oldest first.
func pastLayout(t testing.TB, db *pgxpool.Pool, ends ...time.Duration) []string {
	t.Helper()
	ctx := context.Background()
	parts, now := listPartitions(t, db)
	var next time.Time
	for _, p := range parts {
		if !p.Default && p.From.After(now) && (next.IsZero() || p.From.Before(next)) {
			next = p.From
		}
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`DROP TABLE ingest_task_transition_history`)
	var names []string
	for i, end := range ends {
		name := fmt.Sprintf("ingest_task_transition_past%d", i)
		names = append(names, name)
		exec(fmt.Sprintf(`CREATE TABLE %s PARTITION OF ingest_task_transition FOR VALUES FROM (%s) TO (%s)`,
			name, lit(now.Add(end-time.Hour)), lit(now.Add(end))))
	}
	exec(fmt.Sprintf(`CREATE TABLE ingest_task_transition_current PARTITION OF ingest_task_transition FOR VALUES FROM (%s) TO (%s)`,
		lit(now.Add(ends[len(ends)-1])), lit(next)))
	return names
}

// lit is t as an SQL literal (DDL takes no parameters).
func lit(t time.Time) string { return "'" + t.UTC().Format(time.RFC3339Nano) + "'" }

// auditAt writes an audit row of the task dated at (a past state change)
// and returns its id.
func auditAt(t *testing.T, db *pgxpool.Pool, id uuid.UUID, at time.Time) int64 {
	t.Helper()
	var rowID int64
	if err := db.QueryRow(context.Background(), `INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, message, created_at)
		VALUES ($1, 'QUEUED', 'RUNNING', 1, 'then', $2) RETURNING id`, id, at).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	return rowID
}

func trailIDs(t *testing.T, db *pgxpool.Pool, id uuid.UUID) []int64 {
	t.Helper()
	recs, err := transition.List(context.Background(), db, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

// TestPartitionsCreatedAhead: a pass creates the partitions, Width each,
// from the end of the newest one until they reach Ahead past now, each
// with the primary key the documented query reads; an audit row dated
// beyond every partition (the DEFAULT partition took it) moves into the
// partition created for it, with its id; a second pass creates nothing.
func TestPartitionsCreatedAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const width, ahead = 6 * time.Hour, 5 * 24 * time.Hour
	p := b.partitions(t, maintenance.PartitionsConfig{Width: width, Ahead: ahead})

	before, now := listPartitions(t, b.db)
	newest := before[len(before)-2] // the DEFAULT partition is last
	if newest.Default || !before[len(before)-1].Default || !newest.To.After(now) {
		t.Fatalf("partitions after the migration: %+v; want some ahead of now (%s) and the DEFAULT one", before, now)
	}
	tk, err := b.store.Create(ctx, task.NewTask{Kind: "part", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	late := newest.To.Add(width / 2)
	lateID := auditAt(t, b.db, tk.Task.ID, late)
	if got := partitionOf(t, b.db, lateID); got != "ingest_task_transition_default" {
		t.Fatalf("a row dated %s is in %s, want the DEFAULT partition", late, got)
	}

	res, err := p.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after, now := listPartitions(t, b.db)
	created := after[len(before)-1 : len(after)-1]
	if res.Created != len(created) || len(created) == 0 {
		t.Fatalf("pass created %d, partitions %v; want the new ones counted", res.Created, partitionNames(after))
	}
	prev := newest.To
	for _, c := range created {
		if !c.From.Equal(prev) || c.To.Sub(c.From) != width {
			t.Errorf("partition %s covers [%s, %s); want %s wide from %s", c.Name, c.From, c.To, width, prev)
		}
		prev = c.To
		var def string
		if err := b.db.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`, c.Name).Scan(&def); err != nil || def != "PRIMARY KEY (task_id, id)" {
			t.Errorf("primary key of %s = %q, %v; want (task_id, id)", c.Name, def, err)
		}
	}
	if reach := now.Add(ahead); prev.Before(reach) {
		t.Errorf("partitions reach %s, want at least now + %s = %s", prev, ahead, reach)
	}
	if got := partitionOf(t, b.db, lateID); got == "ingest_task_transition_default" {
		t.Errorf("the row dated %s stayed in the DEFAULT partition", late)
	}
	if ids := trailIDs(t, b.db, tk.Task.ID); len(ids) != 2 || ids[1] != lateID {
		t.Errorf("trail %v, want the creation and row %d", ids, lateID)
	}
	if res, err := p.RunOnce(ctx); err != nil || res.Created != 0 || len(res.Dropped) != 0 {
		t.Errorf("second pass = %+v, %v; want nothing to do", res, err)
	}
	if v := metricValue(t, b.reg, "outbox_maintenance_errors_total", "component", "partitions"); v != 0 {
		t.Errorf("outbox_maintenance_errors_total{component=partitions} = %v, want 0", v)
	}
}

// TestPartitionsDroppedKeepingTheHistoryOfTasksThatExist: two past
// partitions hold rows of tasks that retention deletes and of a task in
// flight whose history spans both. A pass drops both all the same, never
// the current partition, those ahead or the DEFAULT one: the rows of the
// deleted tasks go with them, and the spanning task keeps its whole trail
// (the same rows, ids and times, now in the DEFAULT partition) through
// its completion. With more rows of existing tasks than KeepMax, a
// partition stays instead.
func TestPartitionsDroppedKeepingTheHistoryOfTasksThatExist(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	past := pastLayout(t, b.db, -2*time.Hour, -time.Hour)
	_, now := listPartitions(t, b.db)
	windows := task.Windows{Succeeded: time.Hour, Cancelled: time.Hour, Dead: time.Hour}
	expire := func() []task.Deleted {
		t.Helper()
		d, err := task.DeleteExpired(ctx, b.db, windows, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	x := b.agedTask(t, task.Succeeded, 3*time.Hour) // rows in the first past partition
	y := b.agedTask(t, task.Dead, 3*time.Hour)      // rows in the second
	s := b.agedTask(t, task.Running, 4*time.Hour)   // in flight, rows in both
	gone := []int64{auditAt(t, b.db, x, now.Add(-150*time.Minute)), auditAt(t, b.db, y, now.Add(-90*time.Minute))}
	sRows := []int64{auditAt(t, b.db, s, now.Add(-150*time.Minute)), auditAt(t, b.db, s, now.Add(-140*time.Minute)),
		auditAt(t, b.db, s, now.Add(-90*time.Minute))}
	for i, want := range []string{past[0], past[0], past[1]} {
		if got := partitionOf(t, b.db, sRows[i]); got != want {
			t.Fatalf("the spanning task's row %d is in %s, want %s", sRows[i], got, want)
		}
	}
	trail := auditTrail(t, b.db, s)
	if d := expire(); len(d) != 2 {
		t.Fatalf("retention deleted %+v, want the two finished tasks", d)
	}

	// A KeepMax below the spanning task's rows in the first partition
	// (two) keeps it; the second, with one, goes.
	strict := b.partitions(t, maintenance.PartitionsConfig{KeepMax: 1})
	res, err := strict.RunOnce(ctx)
	if err != nil || !slices.Equal(res.Dropped, past[1:]) || res.Held != 1 || res.Kept != 1 {
		t.Fatalf("pass with KeepMax 1 = %+v, %v; want %s held and %s dropped with 1 row kept", res, err, past[0], past[1])
	}
	if got := auditTrail(t, b.db, s); !slices.Equal(got, trail) {
		t.Fatalf("the spanning task's trail after a drop: %v, want %v", got, trail)
	}
	res, err = b.partitions(t, maintenance.PartitionsConfig{}).RunOnce(ctx)
	if err != nil || !slices.Equal(res.Dropped, past[:1]) || res.Held != 0 || res.Kept != 2 {
		t.Fatalf("pass = %+v, %v; want %s dropped with 2 rows kept", res, err, past[0])
	}
	if got := auditTrail(t, b.db, s); !slices.Equal(got, trail) {
		t.Fatalf("the spanning task's trail after both drops: %v, want %v", got, trail)
	}
	for _, id := range sRows {
		if got := partitionOf(t, b.db, id); got != "ingest_task_transition_default" {
			t.Errorf("the spanning task's row %d is in %s, want the DEFAULT partition", id, got)
		}
	}
	parts, _ := listPartitions(t, b.db)
	names := partitionNames(parts)
	for _, gone := range past {
		if slices.Contains(names, gone) {
			t.Errorf("%s is still there: %v", gone, names)
		}
	}
	if !slices.Contains(names, "ingest_task_transition_current") || !slices.Contains(names, "ingest_task_transition_default") || len(names) < 4 {
		t.Errorf("partitions after the drop: %v; want the current one, those ahead and the DEFAULT one", names)
	}
	var n int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM ingest_task_transition WHERE id = ANY($1)`, gone).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows of the deleted tasks are still there, %v", n, err)
	}
	// It completes: its trail grows on.
	if res, err := b.store.Succeed(ctx, "w", s); err != nil || len(res) != 1 || !res[0].Applied {
		t.Fatalf("Succeed = %+v, %v", res, err)
	}
	if got := auditTrail(t, b.db, s); len(got) != len(trail)+1 || !slices.Equal(got[:len(trail)], trail) {
		t.Fatalf("the spanning task's trail after its completion: %v, want %v and the completion", got, trail)
	}
}

// auditTrail is a task's audit rows as the documented query reads them.
func auditTrail(t *testing.T, db *pgxpool.Pool, id uuid.UUID) []string {
	t.Helper()
	return rowStrings(t, db, `SELECT * FROM ingest_task_transition WHERE task_id = $1 ORDER BY id`, id)
}

// rowStrings runs sql and returns each row's values printed, for
// comparing rows before and after a change.
func rowStrings(t *testing.T, db *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprint(vals...))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPartitionsKeptWhileATransactionFromBeforeTheirEndIsOpen: a
// transaction that began before a partition's end writes an audit row
// into it after the end has passed. Until it commits the partition is not
// dropped (its row is not visible yet, so it would be lost); after, it is
// dropped and the row, whose task exists, kept.
func TestPartitionsKeptWhileATransactionFromBeforeTheirEndIsOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	past := pastLayout(t, b.db, 3*time.Second)
	end := func() time.Time {
		parts, _ := listPartitions(t, b.db)
		for _, p := range parts {
			if p.Name == past[0] {
				return p.To
			}
		}
		t.Fatalf("no partition %s", past[0])
		return time.Time{}
	}()
	p := b.partitions(t, maintenance.PartitionsConfig{})
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var began time.Time
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&began); err != nil || !began.Before(end) {
		t.Fatalf("transaction began %s, %v; want before %s", began, err, end)
	}
	testenv.Eventually(t, 60*time.Second, "the partition's end to pass", func() bool {
		_, now := listPartitions(t, b.db)
		return now.After(end)
	})
	// Created now, with its creation row in the current partition.
	tk, err := b.store.Create(ctx, task.NewTask{Kind: "part", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if ids := trailIDs(t, b.db, tk.Task.ID); len(ids) != 1 || partitionOf(t, b.db, ids[0]) != "ingest_task_transition_current" {
		t.Fatalf("the task's creation row %v is not in the current partition", ids)
	}
	var rowID int64
	if err := tx.QueryRow(ctx, `INSERT INTO ingest_task_transition (task_id, to_status, attempt_count, message)
		VALUES ($1, 'QUEUED', 0, 'late') RETURNING id`, tk.Task.ID).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	if res, err := p.RunOnce(ctx); err != nil || len(res.Dropped) != 0 {
		t.Fatalf("pass with the transaction open = %+v, %v; want nothing dropped", res, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := partitionOf(t, b.db, rowID); got != past[0] {
		t.Fatalf("the late row is in %s, want %s", got, past[0])
	}
	if res, err := p.RunOnce(ctx); err != nil || !slices.Equal(res.Dropped, past) || res.Kept != 1 {
		t.Fatalf("pass after the commit = %+v, %v; want %v dropped, its row kept", res, err, past)
	}
	if ids := trailIDs(t, b.db, tk.Task.ID); len(ids) != 2 || ids[1] != rowID || partitionOf(t, b.db, rowID) != "ingest_task_transition_default" {
		t.Fatalf("the task's trail %v; want its creation and the late row %d, in the DEFAULT partition", ids, rowID)
	}
}

// TestPartitionsRunOnlyOnTheLeader: of two maintainers on one database,
// only the leader runs the partitions' passes, and they create the
// partitions ahead.
func TestPartitionsRunOnlyOnTheLeader(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	cfg := maintenance.Config{
		Elector:         maintenance.ElectorConfig{TTL: 30 * time.Second, RetryInterval: 20 * time.Millisecond},
		RescuerDisabled: true, ConsumersDisabled: true, RetentionDisabled: true, ReleaserDisabled: true,
		Partitions: maintenance.PartitionsConfig{Interval: 20 * time.Millisecond, Width: time.Hour, Ahead: 4 * 24 * time.Hour},
	}
	a := startElected(t, cfg, db)
	testenv.Eventually(t, 10*time.Second, "a to lead", a.m.IsLeader)
	b := startElected(t, cfg, db)
	testenv.Eventually(t, 30*time.Second, "the partitions to reach 4 days ahead", func() bool {
		parts, now := listPartitions(t, db)
		return len(parts) > 1 && !parts[len(parts)-2].To.Before(now.Add(4*24*time.Hour))
	})
	testenv.Eventually(t, 10*time.Second, "a's partitions passes", func() bool { return len(a.rec.times(&a.rec.passEnds)) >= 3 })
	if b.m.IsLeader() || len(b.rec.times(&b.rec.passBegin)) != 0 {
		t.Errorf("the follower ran %d passes (leader: %v)", len(b.rec.times(&b.rec.passBegin)), b.m.IsLeader())
	}
}
