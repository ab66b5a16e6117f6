package migrations_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/migrations"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// TestUpgradeWithLiveTasks upgrades a database that has tasks in every
// state, written under the schema before migration 12 (the smaller write
// set), and checks that the new indexes hold them and the task store
// works on them: a running task completes, the rescuer sees the unfinished
// ones, the listings by state find each, and audit trails stay whole.
// Then it downgrades and upgrades again.
func TestUpgradeWithLiveTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := migratedTo(t, 11)
	exec := execer(t, db.Pool)
	// One task per state, each with its audit rows and an outbox row, as
	// version 11 wrote them, created an hour ago (their ids are UUIDv7s of
	// that time: the rescuer reads only tasks older than its grace).
	ids := map[task.State]uuid.UUID{}
	for _, st := range task.States {
		id := idAt(time.Now().Add(-time.Hour))
		ids[st] = id
		exec(`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts) VALUES ($1, 'up', '{}', 'sha', 3)`, id)
		exec(`INSERT INTO ingest_task_transition (task_id, to_status, attempt_count) VALUES ($1, 'QUEUED', 0)`, id)
		exec(`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at, created_at)
		      VALUES ($1, 's', 'SENT', '1-1', now() - interval '1 hour', now() - interval '1 hour')`, id)
	}
	exec(`UPDATE ingest_task SET status = 'RUNNING', lease_owner = 'w1', lease_until = now() + interval '1 hour' WHERE id = $1`, ids[task.Running])
	exec(`UPDATE ingest_task SET status = 'RETRYING', attempt_count = 1, last_error = 'e', next_retry_at = now() WHERE id = $1`, ids[task.Retrying])
	exec(`UPDATE ingest_task SET status = 'SUCCEEDED', finished_at = now() WHERE id = $1`, ids[task.Succeeded])
	exec(`UPDATE ingest_task SET status = 'DEAD', attempt_count = 3, last_error = 'boom', finished_at = now() WHERE id = $1`, ids[task.Dead])
	exec(`UPDATE ingest_task SET status = 'CANCELLED', cancel_requested_at = now(), cancel_requested_by = 'op', finished_at = now() WHERE id = $1`, ids[task.Cancelled])

	applied, err := migrations.Up(ctx, db.Pool)
	if err != nil || !slices.Equal(applied, versions[11:]) {
		t.Fatalf("Up = %v, %v; want %v", applied, err, versions[11:])
	}

	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range task.States {
		got, _, err := store.List(ctx, task.ListParams{Status: st, Kind: "up"})
		if err != nil || len(got) != 1 || got[0].ID != ids[st] {
			t.Errorf("List(%s) = %v, %v; want the one task %s", st, got, err, ids[st])
		}
	}
	counts, err := task.CappedCounts(ctx, db.Pool, task.States, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range task.States {
		if counts[st] != 1 {
			t.Errorf("CappedCounts[%s] = %d, want 1 (%v)", st, counts[st], counts)
		}
	}
	// The rescuer's classes read the unfinished tasks: the QUEUED one is a
	// candidate of its class (its only outbox row was sent an hour ago).
	page, err := task.RescueCandidates(ctx, db.Pool, task.RescueQueued, task.RescueCursor{}, 100, time.Minute)
	if err != nil || len(page.Candidates) != 1 || page.Candidates[0].ID != ids[task.Queued] || !page.Candidates[0].Eligible {
		t.Errorf("rescue candidates = %+v, %v; want the QUEUED task, eligible", page, err)
	}
	// Tasks written before migration 18 become dependencies: a live one
	// holds its new dependent, a SUCCEEDED one releases it at once, a DEAD
	// or CANCELLED one cancels it.
	dependents := map[task.State]task.Task{}
	for _, st := range task.States {
		r, err := store.Create(ctx, task.NewTask{Kind: "dep", Payload: []byte(`{}`), DependsOn: []uuid.UUID{ids[st]}})
		if err != nil {
			t.Fatalf("create a dependent of the %s task: %v", st, err)
		}
		dependents[st] = r.Task
		want, waiting := task.Queued, 1
		switch st {
		case task.Succeeded:
			waiting = 0
		case task.Dead, task.Cancelled:
			want = task.Cancelled
		}
		if r.Task.Status != want || (want == task.Queued && r.Task.WaitingFor != waiting) {
			t.Errorf("dependent of the %s task: %s waiting %d; want %s waiting %d", st, r.Task.Status, r.Task.WaitingFor, want, waiting)
		}
	}
	// The running task completes, with its audit row.
	res, err := store.Succeed(ctx, "w1", ids[task.Running])
	if err != nil || len(res) != 1 || !res[0].Applied || res[0].Status != task.Succeeded {
		t.Fatalf("Succeed = %+v, %v", res, err)
	}
	_, trail, err := store.GetWithTransitions(ctx, ids[task.Running])
	if err != nil || len(trail) != 2 || trail[1].To != string(task.Succeeded) {
		t.Errorf("trail after the upgrade = %+v, %v; want the old row and SUCCEEDED", trail, err)
	}
	if got, err := store.Get(ctx, dependents[task.Running].ID); err != nil || got.WaitingFor != 0 {
		t.Errorf("dependent of the task that completed: waiting %d, %v; want released", got.WaitingFor, err)
	}

	// Down to 11 (the foreign keys come back, so the rows must still
	// match their tasks) and up again.
	if _, err := p.DownTo(ctx, 11); err != nil {
		t.Fatalf("down to 11: %v", err)
	}
	// 00016's Down dropped the SQL enqueue functions and their helpers.
	var fns []string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(proname::text), '{}') FROM pg_proc
		WHERE proname LIKE 'ingest\_%' AND pronamespace = current_schema()::regnamespace`).Scan(&fns); err != nil || len(fns) != 0 {
		t.Errorf("functions after down to 11: %v, %v; want none", fns, err)
	}
	if applied, err := migrations.Up(ctx, db.Pool); err != nil || !slices.Equal(applied, versions[11:]) {
		t.Fatalf("Up again = %v, %v; want %v", applied, err, versions[11:])
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task_transition`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	// The old tasks' rows and the completion; the dependents' creations
	// and the two cancels by a dependency.
	if want := len(task.States) + 1 + len(task.States) + 2; err != nil || n != want {
		t.Errorf("%d audit rows after down and up, %v; want %d", n, err, want)
	}
}

// TestUpgradeParkedMark upgrades a database whose parked tasks carry the
// mark of before migration 13 (next_retry_at = 9999-12-31) and checks that
// they are parked under the new column, due again once released, while a
// task created with run_at 9999-12-31 (its unsent outbox row due then)
// stays scheduled; then it downgrades (the mark comes back) and upgrades
// again.
func TestUpgradeParkedMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := migratedTo(t, 12)
	exec := execer(t, db.Pool)
	const mark = `'9999-12-31 00:00:00+00'`
	newTask := func(status string, attempts int, nextRetry string, outbox string) uuid.UUID {
		t.Helper()
		id := uuid.Must(uuid.NewV7())
		exec(`INSERT INTO ingest_task (id, kind, payload, payload_sha, status, attempt_count, last_error, next_retry_at, updated_at)
		      VALUES ($1, 'up', '{}', 'sha', $2, $3, NULLIF($4, ''), `+nextRetry+`, now() - interval '1 hour')`,
			id, status, attempts, map[bool]string{true: "boom"}[attempts > 0])
		exec(`INSERT INTO ingest_task_transition (task_id, to_status, attempt_count) VALUES ($1, 'QUEUED', 0)`, id)
		exec(`INSERT INTO outbox_event (task_id, stream, `+outbox+`)`, id)
		return id
	}
	const sent = `status, stream_id, sent_at, next_retry_at) VALUES ($1, 's', 'SENT', '1-1', now() - interval '2 hours', now() - interval '2 hours'`
	parkedQueued := newTask("QUEUED", 0, mark, sent)
	parkedRetrying := newTask("RETRYING", 1, mark, sent)
	scheduled := newTask("QUEUED", 0, mark, `next_retry_at) VALUES ($1, 's', `+mark)
	dueNow := newTask("QUEUED", 0, "NULL", sent)

	if applied, err := migrations.Up(ctx, db.Pool); err != nil || !slices.Equal(applied, versions[12:]) {
		t.Fatalf("Up = %v, %v; want %v", applied, err, versions[12:])
	}
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	get := func(id uuid.UUID) task.Task {
		t.Helper()
		tk, err := store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	for _, id := range []uuid.UUID{parkedQueued, parkedRetrying} {
		tk := get(id)
		if !tk.Parked() || tk.NextRetryAt != nil || tk.ParkedAt == nil || !tk.ParkedAt.Equal(tk.UpdatedAt) {
			t.Fatalf("a task parked before the upgrade reads %+v; want parked since its last update, next_retry_at NULL", tk)
		}
	}
	for _, id := range []uuid.UUID{scheduled, dueNow} {
		if tk := get(id); tk.Parked() {
			t.Fatalf("task %+v reads as parked", tk)
		}
	}
	if tk := get(scheduled); tk.NextRetryAt == nil || tk.NextRetryAt.Year() != 9999 {
		t.Fatalf("the task scheduled for 9999-12-31 reads %+v; want it still scheduled then", tk)
	}
	var def string
	if err := db.Pool.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE indexname = 'ingest_task_parked_idx'`).Scan(&def); err != nil ||
		!strings.Contains(def, "parked_at IS NOT NULL") {
		t.Fatalf("ingest_task_parked_idx = %q, %v; want it on parked_at", def, err)
	}
	k, _, err := store.Kind(ctx, "up")
	if err != nil || k.Parked != 2 {
		t.Fatalf("Kind(up) = %+v, %v; want the two parked tasks", k, err)
	}
	// A parked task does not start; a resume releases the parked ones
	// only.
	rs, err := store.Start(ctx, "w", time.Minute, parkedQueued, scheduled)
	if err != nil || rs[0].Outcome != task.Parked || rs[1].Outcome != task.NotDue {
		t.Fatalf("Start = %+v, %v; want the parked one PARKED, the scheduled one NOT_DUE", rs, err)
	}
	if released, err := store.SetPaused(ctx, "t", "up", false); err != nil || released != 2 {
		t.Fatalf("resume = %d, %v; want 2 released", released, err)
	}
	rs, err = store.Start(ctx, "w", time.Minute, parkedQueued, parkedRetrying, scheduled)
	if err != nil || rs[0].Outcome != task.Started || rs[1].Outcome != task.Started || rs[2].Outcome != task.NotDue {
		t.Fatalf("Start after the resume = %+v, %v; want the released ones started, the scheduled one not due", rs, err)
	}

	// Down: a task parked now gets the mark back.
	if _, err := store.SetPaused(ctx, "t", "up", true); err != nil {
		t.Fatal(err)
	}
	if parked, err := store.Park(ctx, dueNow); err != nil || len(parked) != 1 {
		t.Fatalf("Park = %v, %v", parked, err)
	}
	if _, err := p.DownTo(ctx, 12); err != nil {
		t.Fatalf("down to 12: %v", err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE next_retry_at = `+mark+` AND id = ANY($1)`,
		[]uuid.UUID{dueNow, scheduled}).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d of the parked and the scheduled task carry the mark after the downgrade, %v; want 2", n, err)
	}
	if applied, err := migrations.Up(ctx, db.Pool); err != nil || !slices.Equal(applied, versions[12:]) {
		t.Fatalf("Up again = %v, %v; want %v", applied, err, versions[12:])
	}
	if tk := get(dueNow); !tk.Parked() {
		t.Fatalf("the task parked before the downgrade reads %+v after the upgrade; want parked", tk)
	}
}

// TestUpgradeGroupLimits upgrades a database with a limited kind, a parked
// task and a running one to migration 21: the tasks have no group, the
// kind no per-group limit, and a limited start works on them (the running
// task holds the kind's one slot, so the parked one is parked again);
// then it downgrades to 17 and upgrades again.
func TestUpgradeGroupLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := migratedTo(t, 17)
	running, parked := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	for _, q := range []string{
		`INSERT INTO ingest_kind (kind, paused, concurrency, updated_by) VALUES ('up', false, 1, 'op')`,
		`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, status, lease_owner, lease_until)
		 VALUES ('` + running.String() + `', 'up', '{}', 'sha', 3, 'RUNNING', 'w1', now() + interval '1 hour')`,
		`INSERT INTO ingest_kind_slot (kind, task_id) VALUES ('up', '` + running.String() + `')`,
		`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, parked_at)
		 VALUES ('` + parked.String() + `', 'up', '{}', 'sha', 3, now())`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for range 2 {
		if _, err := migrations.Up(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
		store, err := task.NewStore(task.Config{}, db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		limits, err := store.KindLimits(ctx)
		if l := limits["up"]; err != nil || l.Concurrency != 1 || l.ConcurrencyPerGroup != 0 || l.RatePerGroup.Count != 0 {
			t.Errorf("KindLimits = %+v, %v; want concurrency 1 and no per-group limit", limits, err)
		}
		got, err := store.Get(ctx, parked)
		if err != nil || got.GroupKey != "" || got.ParkedAt == nil {
			t.Fatalf("Get = %+v, %v; want a parked task without a group", got, err)
		}
		if _, err := db.Pool.Exec(ctx, `UPDATE ingest_task SET parked_at = NULL WHERE id = $1`, parked); err != nil {
			t.Fatal(err)
		}
		res, err := store.StartLimited(ctx, "w2", time.Minute, "up", parked)
		if err != nil || len(res) != 1 || res[0].Outcome != task.ParkedAtLimit {
			t.Errorf("StartLimited = %+v, %v; want the task parked at the limit", res, err)
		}
		if _, err := p.DownTo(ctx, 17); err != nil {
			t.Fatalf("down to 17: %v", err)
		}
	}
}

// TestUpgradeAuditPartitions upgrades a live database to the partitioned
// audit table (migration 24) while tasks are being created, and checks
// that no audit row is lost or changed, that the triggers the table had
// (the statement triggers with transition tables, and one of the
// operator's, disabled) and its grants are on the partitioned table, that
// they fire (a completion announces the task and releases its
// dependent), and that ids continue the sequence; then it downgrades (a
// plain table with the rows of the tasks that exist, its triggers) and
// upgrades again.
func TestUpgradeAuditPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const before = 23 // the version before migration 24
	db, p := migratedTo(t, before)
	exec := execer(t, db.Pool)
	exec(`CREATE FUNCTION audit_probe() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`)
	exec(`CREATE TRIGGER audit_probe AFTER DELETE ON ingest_task_transition REFERENCING OLD TABLE AS o
	      FOR EACH STATEMENT EXECUTE FUNCTION audit_probe()`)
	exec(`ALTER TABLE ingest_task_transition DISABLE TRIGGER audit_probe`)
	exec(`GRANT SELECT ON ingest_task_transition TO PUBLIC`)
	triggers := func() []string {
		t.Helper()
		var trigs []string
		if err := db.Pool.QueryRow(ctx, `SELECT array_agg(tgname::text || ':' || tgenabled::text ORDER BY tgname) FROM pg_trigger
			WHERE tgrelid = 'ingest_task_transition'::regclass AND NOT tgisinternal`).Scan(&trigs); err != nil {
			t.Fatal(err)
		}
		return trigs
	}
	// Whatever triggers the table has before the upgrade: those of the
	// migrations before 24 and the operator's, disabled.
	want := triggers()
	if !slices.Contains(want, "audit_probe:D") || len(want) < 2 {
		t.Fatalf("triggers before the upgrade: %v", want)
	}

	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	// Tasks are created through SQL enqueue, which every version from
	// before to the newest has (the store's create is this build's, for
	// the newest schema).
	enqueue := func(kind, options string) (uuid.UUID, error) {
		var id uuid.UUID
		err := db.Pool.QueryRow(ctx, `SELECT ingest_enqueue($1, '{}', $2::jsonb)`, kind, options).Scan(&id)
		return id, err
	}
	create := func(options string) task.Task {
		t.Helper()
		id, err := enqueue("up", options)
		if err != nil {
			t.Fatal(err)
		}
		return task.Task{ID: id}
	}
	running := create(`{}`)
	if rs, err := store.Start(ctx, "w1", time.Hour, running.ID); err != nil || rs[0].Outcome != task.Started {
		t.Fatalf("Start = %+v, %v", rs, err)
	}
	dependent := create(`{"depends_on": ["` + running.ID.String() + `"]}`)
	// An old row of a task that no longer exists (deleted by hand): the
	// downgrade leaves it out, as the schema before keeps no such row.
	orphan := create(`{}`)
	exec(`DELETE FROM ingest_task WHERE id = $1`, orphan.ID)

	type row struct {
		ID          int64
		TaskID      uuid.UUID
		From, To    string
		Attempt     int
		Msg, Worker string
		CreatedAt   time.Time
	}
	rows := func() []row {
		t.Helper()
		rs, err := db.Pool.Query(ctx, `SELECT id, task_id, coalesce(from_status, '-'), to_status, attempt_count,
			coalesce(message, '-'), coalesce(worker, '-'), created_at FROM ingest_task_transition ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rs, pgx.RowToStructByPos[row])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	old := rows()

	// Tasks are created while the migration runs: each either commits
	// before it (into the old table) or waits for it (into the new one).
	stop := make(chan struct{})
	done := make(chan []uuid.UUID)
	go func() {
		var ids []uuid.UUID
		defer func() { done <- ids }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			id, err := enqueue("live", `{}`)
			if err != nil {
				t.Errorf("create during the upgrade: %v", err)
				return
			}
			ids = append(ids, id)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "tasks to be created before the upgrade", func() bool {
		var n int
		return db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE kind = 'live'`).Scan(&n) == nil && n >= 3
	})
	applied, err := migrations.Up(ctx, db.Pool)
	if err != nil || !slices.Equal(applied, versions[before:]) {
		t.Fatalf("Up = %v, %v; want %v", applied, err, versions[before:])
	}
	var liveDuring int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE kind = 'live'`).Scan(&liveDuring); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "tasks to be created after the upgrade", func() bool {
		var n int
		return db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE kind = 'live'`).Scan(&n) == nil && n >= liveDuring+3
	})
	close(stop)
	live := <-done

	var kind string
	if err := db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'ingest_task_transition'::regclass`).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("ingest_task_transition relkind %q, %v; want a partitioned table", kind, err)
	}
	after := rows()
	if len(after) < len(old) || !slices.Equal(after[:len(old)], old) {
		t.Fatalf("the rows of before the upgrade changed:\n%v\nwant\n%v", after[:min(len(old), len(after))], old)
	}
	var missing int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::uuid[]) i
		WHERE NOT EXISTS (SELECT 1 FROM ingest_task_transition a WHERE a.task_id = i AND a.to_status = 'QUEUED')`, live).Scan(&missing); err != nil || missing != 0 {
		t.Fatalf("%d of the %d tasks created around the upgrade lack their creation row, %v", missing, len(live), err)
	}
	checkTriggers := func(stage string) {
		t.Helper()
		if trigs := triggers(); !slices.Equal(trigs, want) {
			t.Errorf("triggers %s: %v, want %v", stage, trigs, want)
		}
		var public bool
		if err := db.Pool.QueryRow(ctx, `SELECT has_table_privilege('public', 'ingest_task_transition', 'SELECT')`).Scan(&public); err != nil || !public {
			t.Errorf("SELECT granted to PUBLIC %s: %v, %v", stage, public, err)
		}
	}
	checkTriggers("after the upgrade")

	// The completion fires the carried triggers: the task, awaited, is
	// announced on ingest_task_done and its dependent released.
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN ingest_task_done`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO ingest_task_awaited (task_id, until) VALUES ($1, now() + interval '1 hour')`, running.ID); err != nil {
		t.Fatal(err)
	}
	if res, err := store.Succeed(ctx, "w1", running.ID); err != nil || len(res) != 1 || !res[0].Applied {
		t.Fatalf("Succeed = %+v, %v", res, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(wctx)
	if err != nil || !strings.Contains(n.Payload, running.ID.String()) {
		t.Fatalf("notification %+v, %v; want the completed task announced", n, err)
	}
	if got, err := store.Get(ctx, dependent.ID); err != nil || got.WaitingFor != 0 {
		t.Fatalf("dependent: waiting %d, %v; want released", got.WaitingFor, err)
	}
	_, trail, err := store.GetWithTransitions(ctx, running.ID)
	if err != nil || len(trail) != 3 || trail[2].To != string(task.Succeeded) || trail[2].ID <= after[len(after)-1].ID {
		t.Fatalf("trail = %+v, %v; want creation, start and a SUCCEEDED row with a later id", trail, err)
	}

	// Down: a plain table with the rows of the tasks that exist.
	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatalf("down to %d: %v", before, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'ingest_task_transition'::regclass`).Scan(&kind); err != nil || kind != "r" {
		t.Fatalf("relkind after the downgrade %q, %v; want a plain table", kind, err)
	}
	checkTriggers("after the downgrade")
	var total, orphans int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE task_id = $1) FROM ingest_task_transition`, orphan.ID).Scan(&total, &orphans); err != nil ||
		orphans != 0 || total != len(after) {
		t.Fatalf("after the downgrade: %d rows, %d of the deleted task, %v; want %d (those of before, less the deleted task's one, and the completion)", total, orphans, err, len(after))
	}
	if _, err := enqueue("up", `{}`); err != nil {
		t.Fatalf("create after the downgrade: %v", err)
	}
	if applied, err := migrations.Up(ctx, db.Pool); err != nil || !slices.Equal(applied, versions[before:]) {
		t.Fatalf("Up again = %v, %v; want %v", applied, err, versions[before:])
	}
	checkTriggers("after the upgrade again")
}

// execer returns a function that runs a statement on pool and fails t
// with the statement and the error when it fails.
func execer(t *testing.T, pool *pgxpool.Pool) func(q string, args ...any) {
	return func(q string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// migratedTo returns an empty database of the test's own migrated up to
// version v, and the goose provider that moves it between versions.
func migratedTo(t *testing.T, v int64) (*testenv.Database, *goose.Provider) {
	t.Helper()
	db := testenv.NewEmptyDatabase(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.Files(),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	return db, p
}

// createAsBefore creates a task of kind with its outbox row, NEW and due
// now, as the store wrote them before migration 38: the row through
// outbox_event, which is a table before that migration and a view after.
// The upgrade tests make their rows on older schemas with it, since
// today's store names tables those schemas do not have.
func createAsBefore(ctx context.Context, pool *pgxpool.Pool, kind string) (uuid.UUID, error) {
	id := uuid.New()
	_, err := pool.Exec(ctx, `WITH t AS (INSERT INTO ingest_task (id, kind, payload, payload_sha)
		VALUES ($1, $2, '{}', encode(sha256('{}'), 'hex')) RETURNING id)
		INSERT INTO outbox_event (task_id, stream) SELECT id, $3 FROM t`, id, kind, stream.DefaultStream)
	return id, err
}

// TestUpgradeOutboxPartitions upgrades a live database to the outbox
// partitioned by id ranges (migration 27) while tasks are being created,
// and checks that no outbox row is lost or changed, that the existing
// table became the first partition (its rows not copied) with partitions
// opened ahead past the last id, that the table's triggers (the NOTIFY of
// new rows, and one of the operator's, disabled) and grants are on the
// partitioned table and fire, that the operator's query works as written
// and ids continue the sequence into a partition of their own; then it
// downgrades (a plain table with the rows of the tasks that exist) and
// upgrades again.
func TestUpgradeOutboxPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const before = 26 // the version before migration 27
	var want []int64  // the versions after it
	for _, v := range versions {
		if v > before {
			want = append(want, v)
		}
	}
	db, p := migratedTo(t, before)
	exec := execer(t, db.Pool)
	exec(`CREATE FUNCTION outbox_probe() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$`)
	exec(`CREATE TRIGGER outbox_probe AFTER DELETE ON outbox_event FOR EACH STATEMENT EXECUTE FUNCTION outbox_probe()`)
	exec(`ALTER TABLE outbox_event DISABLE TRIGGER outbox_probe`)
	exec(`GRANT SELECT ON outbox_event TO PUBLIC`)
	triggers := func() []string {
		t.Helper()
		var trigs []string
		// The table of the outbox's rows: outbox_event until migration
		// 38, outbox_row (behind the view outbox_event) since.
		if err := db.Pool.QueryRow(ctx, `SELECT array_agg(tgname::text || ':' || tgenabled::text ORDER BY tgname) FROM pg_trigger
			WHERE tgrelid = coalesce(to_regclass('outbox_row'), 'outbox_event'::regclass) AND NOT tgisinternal`).Scan(&trigs); err != nil {
			t.Fatal(err)
		}
		return trigs
	}
	wantTrigs := triggers()
	if !slices.Contains(wantTrigs, "outbox_probe:D") || !slices.Contains(wantTrigs, "outbox_event_notify:O") {
		t.Fatalf("triggers before the upgrade: %v", wantTrigs)
	}

	var ids []uuid.UUID
	for range 5 {
		id, err := createAsBefore(ctx, db.Pool, "up")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// Two published, one failed for good; one of a task deleted by hand,
	// which the downgrade leaves out.
	exec(`UPDATE outbox_event SET status = 'SENT', stream_id = '1-' || id, sent_at = now() WHERE task_id = ANY($1)`, ids[:2])
	exec(`UPDATE outbox_event SET status = 'DEAD', attempt_count = 5, next_retry_at = NULL, last_error = 'boom' WHERE task_id = $1`, ids[2])
	exec(`DELETE FROM ingest_task WHERE id = $1`, ids[4])

	type row struct {
		ID        int64
		TaskID    uuid.UUID
		Stream    string
		Status    string
		Attempts  int
		Retry     string
		Err       string
		StreamID  string
		CreatedAt time.Time
		SentAt    string
	}
	rows := func() []row {
		t.Helper()
		rs, err := db.Pool.Query(ctx, `SELECT id, task_id, stream, status, attempt_count, coalesce(next_retry_at::text, '-'),
			coalesce(last_error, '-'), coalesce(stream_id, '-'), created_at, coalesce(sent_at::text, '-') FROM outbox_event ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rs, pgx.RowToStructByPos[row])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	old := rows()

	stop := make(chan struct{})
	done := make(chan []uuid.UUID)
	go func() {
		var ids []uuid.UUID
		defer func() { done <- ids }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			// A process of the release before: the upgrade does
			// not stop it.
			id, err := createAsBefore(ctx, db.Pool, "live")
			if err != nil {
				t.Errorf("create during the upgrade: %v", err)
				return
			}
			ids = append(ids, id)
		}
	}()
	testenv.Eventually(t, 30*time.Second, "tasks to be created before the upgrade", func() bool {
		var n int
		return db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE kind = 'live'`).Scan(&n) == nil && n >= 3
	})
	applied, err := migrations.Up(ctx, db.Pool)
	if err != nil || !slices.Equal(applied, want) {
		close(stop)
		<-done
		t.Fatalf("Up = %v, %v; want %v", applied, err, want)
	}
	var liveDuring int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE kind = 'live'`).Scan(&liveDuring); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "tasks to be created after the upgrade", func() bool {
		var n int
		return db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE kind = 'live'`).Scan(&n) == nil && n >= liveDuring+3
	})
	close(stop)
	live := <-done

	var kind string
	if err := db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'outbox_row'::regclass`).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("outbox_row relkind %q, %v; want a partitioned table", kind, err)
	}
	after := rows()
	if len(after) < len(old) || !slices.Equal(after[:len(old)], old) {
		t.Fatalf("the rows of before the upgrade changed:\n%v\nwant\n%v", after[:min(len(old), len(after))], old)
	}
	var missing int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM unnest($1::uuid[]) i
		WHERE NOT EXISTS (SELECT 1 FROM outbox_event o WHERE o.task_id = i)`, live).Scan(&missing); err != nil || missing != 0 {
		t.Fatalf("%d of the %d tasks created around the upgrade lack their outbox row, %v", missing, len(live), err)
	}
	// The old rows are in the first partition, the table as it was; the
	// partitions reach past the last id.
	var inHistory int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event_history WHERE id <= $1`, old[len(old)-1].ID).Scan(&inHistory); err != nil || inHistory != len(old) {
		t.Fatalf("%d of the %d rows of before in outbox_event_history, %v", inHistory, len(old), err)
	}
	var reach, last int64
	if err := db.Pool.QueryRow(ctx, `SELECT max(hi), outbox_event_last_id() FROM outbox_event_partitions()`).Scan(&reach, &last); err != nil || reach <= last {
		t.Fatalf("partitions reach %d, last id %d, %v; want them past it", reach, last, err)
	}
	checkTriggers := func(stage string) {
		t.Helper()
		if trigs := triggers(); !slices.Equal(trigs, wantTrigs) {
			t.Errorf("triggers %s: %v, want %v", stage, trigs, wantTrigs)
		}
		var public bool
		if err := db.Pool.QueryRow(ctx, `SELECT has_table_privilege('public', 'outbox_event', 'SELECT')`).Scan(&public); err != nil || !public {
			t.Errorf("SELECT granted to PUBLIC %s: %v, %v", stage, public, err)
		}
	}
	checkTriggers("after the upgrade")

	// A new row is announced, takes the next id, and lands in a
	// partition of its own range, not the DEFAULT one.
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN ingest_outbox`); err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	// A task with a group: its row is outbox_row's (the rows of other
	// created tasks are the outbox log's, migration 39).
	r, err := store.Create(ctx, task.NewTask{Kind: "up", Payload: []byte(`{}`), GroupKey: "up"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("no notification of the new outbox row: %v", err)
	}
	var newID int64
	var part string
	if err := db.Pool.QueryRow(ctx, `SELECT id, tableoid::regclass::text FROM outbox_row WHERE task_id = $1`, r.Task.ID).Scan(&newID, &part); err != nil ||
		newID <= after[len(after)-1].ID || part == "outbox_event_default" || part == "outbox_event_history" {
		t.Fatalf("new row %d in %s, %v; want an id after %d in a partition opened ahead", newID, part, err, after[len(after)-1].ID)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT id,status,attempt_count,next_retry_at,last_error,created_at,sent_at FROM outbox_event ORDER BY created_at DESC LIMIT 20`); err != nil {
		t.Fatalf("the operator's query: %v", err)
	}

	// Down: a plain table with the rows of the tasks that exist.
	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatalf("down to %d: %v", before, err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'outbox_event'::regclass`).Scan(&kind); err != nil || kind != "r" {
		t.Fatalf("relkind after the downgrade %q, %v; want a plain table", kind, err)
	}
	checkTriggers("after the downgrade")
	var total, orphans int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE task_id = $1) FROM outbox_event`, ids[4]).Scan(&total, &orphans); err != nil ||
		orphans != 0 || total != len(after) {
		t.Fatalf("after the downgrade: %d rows, %d of the deleted task, %v; want %d (those of before, less the deleted task's one, and the new one)", total, orphans, err, len(after))
	}
	if _, err := createAsBefore(ctx, db.Pool, "up"); err != nil {
		t.Fatalf("create after the downgrade: %v", err)
	}
	if applied, err := migrations.Up(ctx, db.Pool); err != nil || !slices.Equal(applied, want) {
		t.Fatalf("Up again = %v, %v; want %v", applied, err, want)
	}
	checkTriggers("after the upgrade again")
}

// TestUpgradeOutboxDeadIndex upgrades a database whose outbox has rows,
// some DEAD, in several partitions to the index of DEAD rows (migration
// 37), and checks that every partition has its own, named after it and
// taken by the parent's index, that a partition the leader opens after
// the upgrade gets one too, and that the downgrade removes them all and
// opens partitions without one.
func TestUpgradeOutboxDeadIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const before, version = 36, 37
	db, p := migratedTo(t, before)
	exec := execer(t, db.Pool)
	// 10,000 rows fill the first partition opened ahead, the next go to
	// the DEFAULT one; one in a thousand is DEAD.
	insert := func(n int) {
		t.Helper()
		exec(`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at, next_retry_at)
			SELECT gen_random_uuid(), 's', 'SENT', '1-' || g, now(), NULL FROM generate_series(1, $1::int) g`, n)
		exec(`UPDATE outbox_event SET status = 'DEAD', attempt_count = 5, last_error = 'boom', stream_id = NULL, sent_at = NULL
			WHERE status = 'SENT' AND id % 1000 = 0`)
	}
	insert(10500)
	// indexed returns the partitions, and those without their DEAD index
	// (<partition>_dead_idx, a partition of outbox_event_dead_idx).
	indexed := func(what string) (parts, missing []string) {
		t.Helper()
		rows, err := db.Pool.Query(ctx, `
			SELECT p.name, NOT EXISTS (
			    SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_index x ON x.indexrelid = c.oid
			    WHERE i.inhparent = to_regclass('outbox_event_dead_idx') AND c.relname = p.name || '_dead_idx'
			      AND x.indrelid = to_regclass(quote_ident(p.name)) AND x.indisvalid)
			FROM outbox_event_partitions() p ORDER BY p.name`)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for rows.Next() {
			var name string
			var miss bool
			if err := rows.Scan(&name, &miss); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			parts = append(parts, name)
			if miss {
				missing = append(missing, name)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return parts, missing
	}
	countDead := func(what string, want int) {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE status = 'DEAD'`).Scan(&n); err != nil || n != want {
			t.Fatalf("%s: %d DEAD rows, %v; want %d", what, n, err, want)
		}
	}

	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatalf("up to %d: %v", version, err)
	}
	parts, missing := indexed("after the upgrade")
	if len(parts) < 3 || len(missing) > 0 {
		t.Fatalf("after the upgrade: partitions %v, %v without their DEAD index", parts, missing)
	}
	var valid bool
	if err := db.Pool.QueryRow(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_event_dead_idx'::regclass`).Scan(&valid); err != nil || !valid {
		t.Fatalf("outbox_event_dead_idx valid %v, %v", valid, err)
	}
	countDead("after the upgrade", 10)

	// The leader's extension moves the rows the DEFAULT partition holds
	// into partitions it opens, each built with its DEAD index.
	insert(10000)
	var opened int
	if err := db.Pool.QueryRow(ctx, `SELECT outbox_event_extend('1 day', '2 days', 10000)`).Scan(&opened); err != nil || opened == 0 {
		t.Fatalf("extension after the upgrade opened %d partitions, %v", opened, err)
	}
	if more, missing := indexed("after an extension"); len(more) != len(parts)+opened || len(missing) > 0 {
		t.Fatalf("after an extension: partitions %v, %v without their DEAD index", more, missing)
	}
	countDead("after an extension", 20)

	// Down: no DEAD index, and partitions opened without one.
	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatalf("down to %d: %v", before, err)
	}
	insert(10000)
	if err := db.Pool.QueryRow(ctx, `SELECT outbox_event_extend('1 day', '2 days', 10000)`).Scan(&opened); err != nil || opened == 0 {
		t.Fatalf("extension after the downgrade opened %d partitions, %v", opened, err)
	}
	var left []string
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(relname::text), '{}') FROM pg_class WHERE relkind IN ('i', 'I') AND relname LIKE 'outbox\_%\_dead\_idx'`).Scan(&left); err != nil || len(left) > 0 {
		t.Fatalf("after the downgrade: DEAD indexes %v, %v; want none", left, err)
	}
	countDead("after the downgrade", 30)

	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatalf("up to %d again: %v", version, err)
	}
	if parts, missing := indexed("after the upgrade again"); len(missing) > 0 {
		t.Fatalf("after the upgrade again: partitions %v, %v without their DEAD index", parts, missing)
	}
	countDead("after the upgrade again", 30)
}

// idAt returns a random UUIDv7 whose time is at.
func idAt(at time.Time) uuid.UUID {
	id := uuid.Must(uuid.NewV7())
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id
}
