package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/pgsession"
)

// PgBouncer and other connection poolers (docs/DEPLOYMENT.md "PgBouncer",
// docs/ARCHITECTURE.md §5.2). openDB asks whether INGEST_DATABASE_URL goes
// through a pooler; if so, the pool stops using named prepared statements,
// and what needs a session of its own (LISTEN, the migration lock) goes to
// INGEST_DATABASE_LISTEN_URL, or is done without.

// behindPooler finds out whether pool (built from pc) reaches PostgreSQL
// through a connection pooler, and then returns a pool that works through
// one: the same settings with pgsession.PoolerQueryExecMode, unless the
// URL chooses its query mode itself (default_query_exec_mode). A pool
// connected directly is returned as it is: the default path costs one
// statement at start-up.
func (a *app) behindPooler(ctx context.Context, pc *pgxpool.Config, pool *pgxpool.Pool) (*pgxpool.Pool, error) {
	pooled, err := pgsession.PoolPooled(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL %s: %w", a.dbShown(), err)
	}
	a.dbPooled = pooled
	if !pooled || pgsession.NamesExecMode(a.cfg.DatabaseURL) {
		return pool, nil
	}
	pool.Close()
	pc.ConnConfig.DefaultQueryExecMode = pgsession.PoolerQueryExecMode
	if pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL %s: %w", a.dbShown(), err)
	}
	return pool, nil
}

// listenSource says where the worker's LISTEN connections come from:
// INGEST_DATABASE_LISTEN_URL when set (checked: it must reach the same
// database as pool, directly); else nowhere when pool is behind a pooler
// (the components poll); else the pool's own settings.
func (a *app) listenSource(ctx context.Context, pool *pgxpool.Pool) (pgsession.Source, error) {
	if a.cfg.DatabaseListenURL == "" {
		if a.dbPooled {
			a.log.Warn("INGEST_DATABASE_URL goes through a connection pooler and INGEST_DATABASE_LISTEN_URL is not set: nothing LISTENs; "+
				"the outbox relay polls (tasks created by other processes are published within INGEST_OUTBOX_PUBLISH_INTERVAL_MS), "+
				"cancel requests reach running handlers at their next lease renewal (INGEST_TASK_LEASE_MS/3)",
				"publish_interval", a.cfg.OutboxPublishInterval)
			return pgsession.Source{None: true}, nil
		}
		return pgsession.Source{}, nil
	}
	cfg, err := a.directConn(ctx, pool)
	if err != nil {
		return pgsession.Source{}, err
	}
	return pgsession.Source{Conn: cfg}, nil
}

// directConn parses INGEST_DATABASE_LISTEN_URL and checks, on one
// connection, that it reaches PostgreSQL without a pooler and the same
// database as pool (when pool is not nil).
func (a *app) directConn(ctx context.Context, pool *pgxpool.Pool) (*pgx.ConnConfig, error) {
	shown := redact.DSN(a.cfg.DatabaseListenURL)
	cfg, err := pgx.ParseConfig(a.cfg.DatabaseListenURL)
	if err != nil {
		return nil, usagef("INGEST_DATABASE_LISTEN_URL: %s is not a valid connection string", shown)
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL %s (INGEST_DATABASE_LISTEN_URL): %w", shown, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	pooled, err := pgsession.Pooled(cctx, conn.PgConn())
	if err != nil {
		return nil, fmt.Errorf("INGEST_DATABASE_LISTEN_URL %s: %w", shown, err)
	}
	if pooled {
		return nil, usagef("INGEST_DATABASE_LISTEN_URL: %s goes through a connection pooler; it must connect to PostgreSQL directly (LISTEN and the migration lock need a session of their own)", shown)
	}
	if pool != nil {
		var direct, main string
		if err := conn.QueryRow(cctx, "SELECT current_database()", pgx.QueryExecModeSimpleProtocol).Scan(&direct); err != nil {
			return nil, fmt.Errorf("INGEST_DATABASE_LISTEN_URL %s: %w", shown, err)
		}
		if err := pool.QueryRow(cctx, "SELECT current_database()").Scan(&main); err != nil {
			return nil, fmt.Errorf("connect to PostgreSQL %s: %w", a.dbShown(), err)
		}
		if direct != main {
			return nil, usagef("INGEST_DATABASE_LISTEN_URL: %s connects to the database %q, but INGEST_DATABASE_URL to %q: they must name the same database", shown, direct, main)
		}
	}
	return cfg, nil
}

// openMigrationDB returns the pool migrate applies migrations through.
// Applying holds an advisory lock for the whole run, which needs a
// session: so INGEST_DATABASE_LISTEN_URL's direct connection when set, and
// a refusal when pool goes through a pooler without it. closeFn closes
// what it opened.
func (a *app) openMigrationDB(ctx context.Context, pool *pgxpool.Pool) (migrationPool *pgxpool.Pool, closeFn func(), err error) {
	if a.cfg.DatabaseListenURL == "" {
		if a.dbPooled {
			return nil, nil, usagef("migrate holds an advisory lock for the whole run, which needs a PostgreSQL session of its own, "+
				"but INGEST_DATABASE_URL (%s) goes through a connection pooler: set INGEST_DATABASE_LISTEN_URL to a direct connection "+
				"to the same database (migrate then applies through it), or point INGEST_DATABASE_URL at PostgreSQL itself for the migration", a.dbShown())
		}
		return pool, func() {}, nil
	}
	if _, err := a.directConn(ctx, pool); err != nil {
		return nil, nil, err
	}
	pc, err := pgxpool.ParseConfig(a.cfg.DatabaseListenURL)
	if err != nil {
		return nil, nil, usagef("INGEST_DATABASE_LISTEN_URL: %s is not a valid connection string", redact.DSN(a.cfg.DatabaseListenURL))
	}
	pc.MaxConns = 4
	direct, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to PostgreSQL %s (INGEST_DATABASE_LISTEN_URL): %w", redact.DSN(a.cfg.DatabaseListenURL), err)
	}
	return direct, direct.Close, nil
}
