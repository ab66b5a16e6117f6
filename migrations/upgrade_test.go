package migrations_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/migrations"
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
	db := testenv.NewEmptyDatabase(t)
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.Files(),
		goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 11); err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// One task per state, each with its audit rows and an outbox row, as
	// version 11 wrote them.
	ids := map[task.State]uuid.UUID{}
	for _, st := range task.States {
		id := uuid.Must(uuid.NewV7())
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
	if err != nil || !slices.Equal(applied, []int64{12, 13}) {
		t.Fatalf("Up = %v, %v; want [12 13]", applied, err)
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
	// The running task completes, with its audit row.
	res, err := store.Succeed(ctx, "w1", ids[task.Running])
	if err != nil || len(res) != 1 || !res[0].Applied || res[0].Status != task.Succeeded {
		t.Fatalf("Succeed = %+v, %v", res, err)
	}
	_, trail, err := store.GetWithTransitions(ctx, ids[task.Running])
	if err != nil || len(trail) != 2 || trail[1].To != string(task.Succeeded) {
		t.Errorf("trail after the upgrade = %+v, %v; want the old row and SUCCEEDED", trail, err)
	}

	// Down to 11 (the foreign keys come back, so the rows must still
	// match their tasks) and up again.
	if _, err := p.DownTo(ctx, 11); err != nil {
		t.Fatalf("down to 11: %v", err)
	}
	if applied, err := migrations.Up(ctx, db.Pool); err != nil || !slices.Equal(applied, []int64{12, 13}) {
		t.Fatalf("Up again = %v, %v; want [12 13]", applied, err)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task_transition`).Scan(&n); err != nil || n != len(task.States)+1 {
		t.Errorf("%d audit rows after down and up, %v; want %d", n, err, len(task.States)+1)
	}
}
