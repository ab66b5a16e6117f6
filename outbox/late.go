package outbox

import (
	"context"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// A relay finds late rows by id (see scan.go): rows that became visible
// after its claims had read past their next_retry_at. Every PublishInterval
// (the relay's poll) it reads, on the primary key, the rows with an id
// above its floor, and lowers its bound on the claim index to the earliest
// unsent due one among them. Reading from the front of the claim index
// instead would walk the entries of every row sent since the oldest open
// transaction began, which vacuum cannot remove while it is open (a
// transaction held open for minutes made each such read walk hundreds of
// thousands of them); the read by id walks the rows created since the
// previous read or two, whatever is held open.
//
// The floor is an id below which every row was visible to an earlier read.
// Ids come from outbox_event_id_seq (no cache: in the order taken), and a
// transaction that takes one holds a lock on outbox_event that lets it
// write until it ends. So each read also records the sequence's last value
// and the virtual transactions then holding such a lock (a mark); once
// none of a mark's transactions is open, checked at the start of a later
// read, every row with an id up to the mark's value has committed or
// rolled back before that read, which sees it; the read after it may take
// the mark's value as its floor. A transaction kept open after writing an
// outbox row holds the floor back until it ends (each read then reads more
// rows), never past a row.

// lateLimit is how many rows a read by id reads at most. When there are
// more above the floor (a writer kept open for long holds the floor back),
// the next claim reads from the front instead.
const lateLimit = 50000

// lateOpenSQL returns which of the virtual transactions $1 still run.
const lateOpenSQL = `SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}') FROM pg_locks l WHERE l.virtualtransaction = ANY($1::text[])`

// lateSQL reads the first $2 rows in id order above $1, on the primary
// keys of the partitions, and returns the earliest next_retry_at among
// those that are due, unsent and not under a live claim, how many those
// are, and how many rows it read. The rows are read by id alone (a
// materialized CTE): with the unsent guard beside it, the planner read
// the claim index instead, every entry of it, and filtered on id.
const lateSQL = `
WITH r AS MATERIALIZED (
    SELECT status, next_retry_at, claimed_until FROM outbox_row WHERE id > $1 ORDER BY id LIMIT $2
)
SELECT min(next_retry_at) FILTER (WHERE ` + lateDueSQL + `), count(*) FILTER (WHERE ` + lateDueSQL + `), count(*) FROM r`

// lateDueSQL holds for a row of lateSQL's that a claim would take.
const lateDueSQL = `status IN ('NEW', 'RETRYING') AND next_retry_at <= now() AND (claimed_until IS NULL OR claimed_until < now())`

// lateMarkSQL reads the last id taken; lateWritersSQL, after it, the
// virtual transactions holding a lock on outbox_event's table (outbox_row,
// which a write through the view locks too) that lets them write
// (prepared transactions too), other than this session.
const (
	lateMarkSQL    = `SELECT coalesce(pg_sequence_last_value('outbox_event_id_seq'), 0)`
	lateWritersSQL = `
SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}') FROM pg_locks l
WHERE l.locktype = 'relation' AND l.relation = 'outbox_row'::regclass
  AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
  AND l.mode NOT IN ('AccessShareLock', 'RowShareLock') AND l.pid IS DISTINCT FROM pg_backend_pid()`
)

// lateMark is the last id taken at a read, and the transactions that may
// still have been writing ids up to it.
type lateMark struct {
	last    int64
	writers []string
}

// lateReads is a relay's state of the reads by id. Only Run's loop uses it.
type lateReads struct {
	// floor: every row with an id at or below it was visible to an
	// earlier read; -1 until known.
	floor int64
	// marks, oldest first, wait for their writers to end.
	marks []lateMark
}

// readLate runs one read by id and moves r's bound (scan.go): lower to the
// earliest late row it found, or reset to the front when it cannot tell
// (no floor yet, too many rows, an error).
func (r *Relay) readLate(ctx context.Context) {
	l := &r.late
	var waiting []string
	for _, m := range l.marks {
		waiting = append(waiting, m.writers...)
	}
	slices.Sort(waiting)
	waiting = slices.Compact(waiting)
	floor := l.floor
	batch := &pgx.Batch{}
	batch.Queue(claimPlanSQL)
	batch.Queue(lateOpenSQL, waiting)
	if floor >= 0 {
		batch.Queue(lateSQL, floor, lateLimit)
	}
	batch.Queue(lateMarkSQL)
	batch.Queue(lateWritersSQL)
	var open []string
	var due pgtype.Timestamptz
	var n, read int
	var m lateMark
	br := r.pool.SendBatch(ctx, batch)
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&open)
	}
	if err == nil && floor >= 0 {
		err = br.QueryRow().Scan(&due, &n, &read)
	}
	if err == nil {
		err = br.QueryRow().Scan(&m.last)
	}
	if err == nil {
		err = br.QueryRow().Scan(&m.writers)
	}
	if err = errors.Join(err, br.Close()); err != nil {
		r.from.reset()
		if ctx.Err() == nil {
			r.logger.Debug("outbox relay: the read for late rows failed; reading from the front", "err", err)
		}
		return
	}
	// Marks whose writers have all ended, checked before this read: the
	// next read may start above them.
	settled := 0
	for settled < len(l.marks) && !slices.ContainsFunc(l.marks[settled].writers, func(w string) bool { return slices.Contains(open, w) }) {
		l.floor = l.marks[settled].last
		settled++
	}
	l.marks = append(l.marks[settled:], m)
	switch {
	case floor < 0 || read >= lateLimit:
		r.from.reset()
	case n > 0:
		r.from.lower(due)
	}
}
