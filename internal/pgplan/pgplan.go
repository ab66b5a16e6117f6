// Package pgplan owns the planner settings that the hot statements run
// under, and the one way to send a statement with them.
//
// The hot statements (start, lease renewal, the completions, the
// reclaimer's lookup, the relay's marking, the kind limits' reservation)
// each join an array of ids to ingest_task or outbox_event. Their only
// sensible plan is a nested loop of primary-key probes, one per id: the
// work is proportional to the ids, never to the table. The planner does
// not always see that. On a table that has never been analyzed (freshly
// migrated, restored or truncated) it assumes ten pages; on one analyzed
// while empty, none. Either way a hash join over a sequential scan of the
// whole table looks cheaper than the probes, and a prepared statement
// keeps that generic plan as the table grows, until an ANALYZE
// invalidates it: each statement then reads the whole table (a queue of
// 500 tasks/s fell behind for 30 s, with 23 of 24 start statements over
// 50 ms, until autovacuum analyzed the table).
//
// No shape of these statements rules the scan out: "id = ANY($1)" is a
// sequential scan with a filter on a small table; a LATERAL probe keeps a
// SELECT on the index, but the target of an UPDATE can only be joined,
// and a LATERAL probe of a table analyzed while empty is a sequential
// scan too. So the statements are sent with Settings, in the same round
// trip and the same implicit transaction (Query, Exec): sequential scans,
// hash joins and merge joins are disabled for that transaction only,
// which leaves the probes, whatever the statistics say. The settings end
// with the transaction; in a caller's transaction they hold until it
// ends, which suits the statements such a transaction runs (rows by id).
package pgplan

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Settings disables, for the current transaction only, every plan of a
// join of ids to a table other than primary-key probes.
const Settings = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)`

// SettingsUnflushed is Settings with synchronous_commit off for the
// current transaction as well: its commit returns without waiting for
// the WAL flush (the WAL writer flushes it within three times
// wal_writer_delay, 600 ms with PostgreSQL's defaults). Only a statement
// whose loss in a crash of PostgreSQL is recovered like any other lost
// work may use it (QueryUnflushed): every later durable commit flushes it
// too, since the WAL is flushed in order.
const SettingsUnflushed = Settings + `, ` + unflushed

// Unflushed is SettingsUnflushed without the planner settings, for a
// transaction whose statements keep the plans the planner chooses.
const Unflushed = `SELECT ` + unflushed

// unflushed turns synchronous_commit off for the current transaction.
const unflushed = `set_config('synchronous_commit', 'off', true)`

// ReadSettings is for a read that aggregates many rows for a chart (the
// dashboard's audit samples): for the current transaction only, JIT is
// off and sorts get 16 MB. Such a statement's generic plan is estimated
// well above jit_above_cost, and compiling it took 0.2 to 3 s on a table
// of a few million rows, against 0.3 s to run it; with the default 4 MB
// of work_mem its sorts of 50,000 rows spilled to disk.
const ReadSettings = `SELECT set_config('jit', 'off', true), set_config('work_mem', '16MB', true)`

// CountSettings is Settings with JIT off, for a count the leader takes
// every few seconds over a partial index (parked tasks, blocked
// sequences). On stale statistics the planner chose a sequential scan of
// ingest_task for them and compiled it (0.3 s of JIT for a 0.5 s scan of
// a few hundred thousand rows, every 5 s); without the scan their cost is
// the index's, and JIT would only add its compile time.
const CountSettings = Settings + `, set_config('jit', 'off', true)`

// QueryCount is Query with CountSettings instead of Settings.
func QueryCount(ctx context.Context, db Batcher, sql string, args ...any) (pgx.Rows, error) {
	return query(ctx, db, CountSettings, sql, args...)
}

// QueryRead is Query with ReadSettings instead of Settings.
func QueryRead(ctx context.Context, db Batcher, sql string, args ...any) (pgx.Rows, error) {
	return query(ctx, db, ReadSettings, sql, args...)
}

// Batcher is what Query and Exec need: a pool, a connection or a pgx.Tx.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Query runs sql with args after Settings, in one round trip and one
// implicit transaction (or in the caller's transaction). The rows end the
// batch when read to their end: once Next returns false and Err is nil,
// the implicit transaction has committed.
func Query(ctx context.Context, db Batcher, sql string, args ...any) (pgx.Rows, error) {
	return query(ctx, db, Settings, sql, args...)
}

// QueryUnflushed is Query with SettingsUnflushed: the implicit transaction
// has committed once the rows are read to their end, but its commit may
// not be flushed to the WAL yet. In a caller's transaction the setting
// holds until that transaction ends.
func QueryUnflushed(ctx context.Context, db Batcher, sql string, args ...any) (pgx.Rows, error) {
	return query(ctx, db, SettingsUnflushed, sql, args...)
}

func query(ctx context.Context, db Batcher, settings, sql string, args ...any) (pgx.Rows, error) {
	b := &pgx.Batch{}
	b.Queue(settings)
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		return nil, errors.Join(err, br.Close())
	}
	rows, err := br.Query()
	if err != nil {
		return nil, errors.Join(err, br.Close())
	}
	return &rowsThenClose{Rows: rows, br: br}, nil
}

// Exec is Query for a statement whose rows are not read.
func Exec(ctx context.Context, db Batcher, sql string, args ...any) (pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	b.Queue(Settings)
	b.Queue(sql, args...)
	br := db.SendBatch(ctx, b)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	return tag, errors.Join(err, br.Close())
}

// rowsThenClose closes its batch once its rows are read or closed, and
// reports the batch's error (the implicit transaction's commit) in Err.
type rowsThenClose struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error
}

func (r *rowsThenClose) Next() bool {
	if r.closed {
		return false
	}
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *rowsThenClose) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *rowsThenClose) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}
