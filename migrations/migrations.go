// Package migrations owns the SQL schema of ingest-worker: numbered goose
// migrations embedded in the binary, applying them (concurrent callers are
// serialised by a Postgres advisory lock), and the start-up check that refuses
// to run against a schema older or newer than this build knows.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// VersionTable is the table goose records applied versions in.
const VersionTable = "ingest_schema_version"

// Sentinel errors returned by Check.
var (
	ErrSchemaOutdated = errors.New("database schema is older than this build")
	ErrSchemaTooNew   = errors.New("database schema is newer than this build")
)

// Status describes the schema of one database.
type Status struct {
	Current int64 // version applied to the database (0: none)
	Latest  int64 // newest version embedded in this build
	Pending []int64
}

// UpToDate reports whether nothing is pending and the database is not ahead.
func (s Status) UpToDate() bool { return s.Current == s.Latest }

func provider(pool *pgxpool.Pool) (*goose.Provider, *sql.DB, error) {
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("migration locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, db, nil
}

// Up applies every pending migration and returns the versions it applied.
// Running it on an up-to-date database applies nothing.
func Up(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	p, db, err := provider(pool)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("apply migrations: %w", err)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// GetStatus reads the database's schema version without changing anything
// and without taking the migration lock, so a start-up check neither waits
// for a running migration nor delays one. A version counts as applied when
// the version table has a row for it, as goose records it.
func GetStatus(ctx context.Context, pool *pgxpool.Pool) (Status, error) {
	var st Status
	p, db, err := provider(pool)
	if err != nil {
		return st, err
	}
	sources := p.ListSources()
	db.Close()
	exists, err := versionTableExists(ctx, pool)
	if err != nil {
		return st, err
	}
	applied := map[int64]bool{}
	if exists {
		rows, err := pool.Query(ctx, `SELECT DISTINCT version_id FROM `+pgx.Identifier{VersionTable}.Sanitize())
		if err != nil {
			return st, fmt.Errorf("read schema version: %w", err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return st, fmt.Errorf("read schema version: %w", err)
		}
		for _, v := range versions {
			applied[v] = true
			st.Current = max(st.Current, v)
		}
	}
	for _, src := range sources {
		st.Latest = max(st.Latest, src.Version)
		if !applied[src.Version] {
			st.Pending = append(st.Pending, src.Version)
		}
	}
	return st, nil
}

// Check returns nil when the database schema is exactly the one this build
// knows, and otherwise an error that says what to run.
func Check(ctx context.Context, pool *pgxpool.Pool) error {
	st, err := GetStatus(ctx, pool)
	if err != nil {
		return err
	}
	switch {
	case st.Current > st.Latest:
		return fmt.Errorf("%w (database at version %d, this build knows up to %d): upgrade ingest-worker", ErrSchemaTooNew, st.Current, st.Latest)
	case st.Current < st.Latest || len(st.Pending) > 0:
		return fmt.Errorf("%w (database at version %d, this build needs %d): run `ingest-worker migrate`", ErrSchemaOutdated, st.Current, st.Latest)
	}
	return nil
}

func versionTableExists(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var ok bool
	err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("look for %s: %w", VersionTable, err)
	}
	return ok, nil
}

// Files returns the embedded migration files.
func Files() fs.FS { return files }
