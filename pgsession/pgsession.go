// Package pgsession decides where the PostgreSQL connections that need a
// session of their own come from, so that everything else can go through
// a transaction-pooling PgBouncer (docs/ARCHITECTURE.md §5.2).
//
// Only LISTEN needs a session while a process runs: the outbox relay's
// wake-ups, the workers' cancel requests and the leader's Redis loss
// reports. Every other statement of the module is a single statement or
// runs inside one transaction, and uses no session state: no session
// advisory lock (the leader election is a lease row), no SET outside a
// transaction (set_config(..., true) only), no temporary table. The pool's
// query mode is the caller's: pgx's default (named prepared statements,
// cached per connection) needs a session too, so behind a pooler the pool
// must use another one; Pooled tells whether a pool is behind one and
// PoolerQueryExecMode names the mode the binary then uses. Redial paces
// the re-opening of a lost LISTEN session, for every listener alike.
package pgsession

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrNone is returned by Source.Connect when no session is available: the
// caller polls instead of listening.
var ErrNone = errors.New("no PostgreSQL session available for LISTEN (the pool goes through a transaction pooler and no direct connection is configured): polling instead")

// Source says how to open a connection with a session of its own. The
// zero Source opens one with the pool's own connection settings, right
// for a pool connected directly to PostgreSQL.
type Source struct {
	// Conn, when set, is the connection settings of sessions: a direct
	// connection to the same database, bypassing the pooler
	// (INGEST_DATABASE_LISTEN_URL).
	Conn *pgx.ConnConfig
	// None says there is no session to be had (the pool goes through a
	// transaction pooler and Conn is nil): nothing LISTENs, and each
	// component falls back to what it does without notifications (the
	// relay polls at its interval, a worker learns of cancel requests from
	// its lease renewals, a leader rescues after its grace).
	None bool
}

// Enabled reports whether Connect can open a session.
func (s Source) Enabled() bool { return !s.None || s.Conn != nil }

// Connect opens a connection with a session of its own, named
// applicationName in pg_stat_activity: with s.Conn when set, else with
// the pool's settings. It returns ErrNone when s is not Enabled.
func (s Source) Connect(ctx context.Context, pool *pgxpool.Pool, applicationName string) (*pgx.Conn, error) {
	var cfg *pgx.ConnConfig
	switch {
	case s.Conn != nil:
		cfg = s.Conn.Copy()
	case s.None:
		return nil, ErrNone
	case pool == nil:
		return nil, errors.New("pgsession: no pool and no connection settings")
	default:
		cfg = pool.Config().ConnConfig.Copy()
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = applicationName
	return pgx.ConnectConfig(ctx, cfg)
}

// PoolerQueryExecMode is the query mode for a pool behind a transaction
// pooler: statement descriptions are cached per connection (one extra
// round trip the first time a connection sees a statement), and each
// statement is sent with its parse, bind and execute in one round trip on
// the unnamed statement, so no server-side state outlives it. Parameters
// and results keep their binary formats, so statements behave exactly as
// with pgx's default mode.
const PoolerQueryExecMode = pgx.QueryExecModeCacheDescribe

// ExecModeParam is the connection string parameter with which pgx lets a
// DSN choose the query mode; a DSN that names it keeps its choice.
const ExecModeParam = "default_query_exec_mode"

// NamesExecMode reports whether dsn chooses the query mode itself.
func NamesExecMode(dsn string) bool { return strings.Contains(dsn, ExecModeParam) }

// Pooled reports whether conn reaches PostgreSQL through a connection
// pooler: the backend process the server reports differs from the one
// named in the connection's startup (a pooler hands its clients keys of
// its own, since it does not tie them to one backend). It sends one
// statement on the simple protocol, safe on a connection whose query mode
// is wrong for a pooler.
func Pooled(ctx context.Context, conn *pgconn.PgConn) (bool, error) {
	res := conn.Exec(ctx, "SELECT pg_backend_pid()")
	results, err := res.ReadAll()
	if err != nil {
		return false, fmt.Errorf("ask for the backend process id: %w", err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 1 {
		return false, errors.New("ask for the backend process id: unexpected answer")
	}
	pid, err := strconv.ParseUint(string(results[0].Rows[0][0]), 10, 32)
	if err != nil {
		return false, fmt.Errorf("ask for the backend process id: %w", err)
	}
	return uint32(pid) != conn.PID(), nil
}

// PoolPooled is Pooled on a connection of pool.
func PoolPooled(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer c.Release()
	return Pooled(ctx, c.Conn().PgConn())
}
