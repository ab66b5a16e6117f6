package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3/lock"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/migrations"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// latest is the newest embedded version; versions are all of them.
const latest = 40

var versions = []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40}

func versionTableExists(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, migrations.VersionTable).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestUpTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewEmptyDatabase(t)
	applied, err := migrations.Up(ctx, db.Pool)
	if err != nil {
		t.Fatalf("first Up: %v", err)
	}
	if !slices.Equal(applied, versions) {
		t.Fatalf("first Up applied %v, want %v", applied, versions)
	}
	applied, err = migrations.Up(ctx, db.Pool)
	if err != nil || len(applied) != 0 {
		t.Fatalf("second Up = %v, %v; want no versions", applied, err)
	}
	// The pool is still usable (closing goose's *sql.DB must not close it)
	// and the schema is there.
	for _, table := range []string{"ingest_task", "ingest_task_transition", "outbox_event"} {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatalf("%s after Up: %v", table, err)
		}
	}
	if err := migrations.Check(ctx, db.Pool); err != nil {
		t.Fatalf("Check after Up = %v, want nil", err)
	}
	st, err := migrations.GetStatus(ctx, db.Pool)
	if err != nil || st.Current != latest || st.Latest != latest || len(st.Pending) != 0 || !st.UpToDate() {
		t.Fatalf("GetStatus after Up = %+v, %v", st, err)
	}
}

func TestUpConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewEmptyDatabase(t)
	const n = 2
	applied := make([][]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			applied[i], errs[i] = migrations.Up(ctx, db.Pool)
		}()
	}
	wg.Wait()
	var all []int64
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Up %d: %v", i, errs[i])
		}
		all = append(all, applied[i]...)
	}
	slices.Sort(all)
	if !slices.Equal(all, versions) {
		t.Fatalf("concurrent Ups applied %v between them, want each of %v once", all, versions)
	}
}

func TestCheckEmptyDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewEmptyDatabase(t)
	err := migrations.Check(ctx, db.Pool)
	if !errors.Is(err, migrations.ErrSchemaOutdated) {
		t.Fatalf("Check on an empty database = %v, want ErrSchemaOutdated", err)
	}
	if !strings.Contains(err.Error(), "ingest-worker migrate") {
		t.Fatalf("Check error %q does not say to run `ingest-worker migrate`", err)
	}
	st, err := migrations.GetStatus(ctx, db.Pool)
	if err != nil || st.Current != 0 || st.Latest != latest || !slices.Equal(st.Pending, versions) || st.UpToDate() {
		t.Fatalf("GetStatus on an empty database = %+v, %v; want version 0 with %v pending", st, err, versions)
	}
	if versionTableExists(t, db.Pool) {
		t.Fatal("Check or GetStatus created the version table: they must not change the database")
	}
}

func TestCheckTooNew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDatabase(t) // migrated
	if err := migrations.Check(ctx, db.Pool); err != nil {
		t.Fatalf("Check on a migrated database = %v", err)
	}
	// A newer build has applied version latest+1.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+migrations.VersionTable+` (version_id, is_applied) VALUES ($1, true)`, latest+1); err != nil {
		t.Fatal(err)
	}
	err := migrations.Check(ctx, db.Pool)
	if !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Fatalf("Check on a newer schema = %v, want ErrSchemaTooNew", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("version %d", latest+1)) {
		t.Fatalf("Check error %q does not name the database's version", err)
	}
	st, err := migrations.GetStatus(ctx, db.Pool)
	if err != nil || st.Current != latest+1 || st.Latest != latest || st.UpToDate() {
		t.Fatalf("GetStatus = %+v, %v; want current %d ahead of latest %d", st, err, latest+1, latest)
	}
	// Up does not roll a newer schema back.
	if applied, err := migrations.Up(ctx, db.Pool); err != nil || len(applied) != 0 {
		t.Fatalf("Up on a newer schema = %v, %v; want nothing applied", applied, err)
	}
}

// TestCheckDoesNotWaitForMigrationLock checks that the start-up check reads
// the schema version without contending for the migration lock, which a
// running `ingest-worker migrate` (or a starting replica) may hold.
func TestCheckDoesNotWaitForMigrationLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, migrated := range []bool{false, true} {
		name := "Empty"
		if migrated {
			name = "Migrated"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var db *testenv.Database
			if migrated {
				db = testenv.NewDatabase(t)
			} else {
				db = testenv.NewEmptyDatabase(t)
			}
			conn, err := db.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			// goose's session lock, as held during Up.
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID); err != nil {
				t.Fatal(err)
			}
			defer conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`) //nolint:errcheck
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			err = migrations.Check(cctx, db.Pool)
			if migrated && err != nil {
				t.Fatalf("Check while the migration lock is held = %v, want nil", err)
			}
			if !migrated && !errors.Is(err, migrations.ErrSchemaOutdated) {
				t.Fatalf("Check while the migration lock is held = %v, want ErrSchemaOutdated", err)
			}
		})
	}
}

// TestFiles checks the embedded migrations: numbered from 1 without gaps,
// the newest being latest, each with an Up and a Down section.
func TestFiles(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(migrations.Files(), "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("embedded migrations: %v, %v", names, err)
	}
	sort.Strings(names)
	valid := regexp.MustCompile(`^(\d{5})_[a-z0-9_]+\.sql$`)
	for i, name := range names {
		m := valid.FindStringSubmatch(name)
		if m == nil {
			t.Fatalf("%s is not named NNNNN_description.sql", name)
		}
		if v, _ := strconv.Atoi(m[1]); v != i+1 {
			t.Fatalf("%s has version %d, want %d (no gaps)", name, v, i+1)
		}
		body, err := fs.ReadFile(migrations.Files(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(body), "-- +goose Up") || !strings.Contains(string(body), "-- +goose Down") {
			t.Fatalf("%s lacks a goose Up or Down section", name)
		}
	}
	if len(names) != latest {
		t.Fatalf("%d migrations embedded; update latest (%d) in this test", len(names), latest)
	}
}
