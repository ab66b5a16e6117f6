package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// The backlog is the outbox rows that are due and not yet in the stream:
// what an operator must worry about when it grows or ages. A delayed
// task's row, written NEW and due at the task's time, is scheduled until
// then: it is nothing late, so it is counted apart and never ages the
// backlog (an hour-long delay must not look like an hour-old stuck row).
//
// When a row became due is one formula, dueSinceSQL, shared by the
// backlog gauges, the operator's readings (ReadStats, ReadBacklog) and the
// publish delay (outbox_publish_delay_seconds).

// dueSinceSQL is the time from which unsent outbox row a (its alias) has
// been due. A row never tried (attempt_count 0) is due at its next_retry_at
// when that is later than its creation (a delayed task's row), else at its
// creation. A row whose publish failed was due before its first attempt
// and is overdue whatever its next retry time; its original due time is not
// kept, so it counts from its creation (for a delayed task's row that
// overstates its wait by the delay, and only while publishing fails).
func dueSinceSQL(a string) string {
	return `CASE WHEN ` + a + `.attempt_count = 0 THEN greatest(` + a + `.created_at, ` + a + `.next_retry_at) ELSE ` + a + `.created_at END`
}

// Backlog counts the unsent outbox rows (NEW, RETRYING) by whether they are
// due (see dueSinceSQL).
type Backlog struct {
	// Due rows are waiting to be published: their time has come, or a
	// publish of theirs failed.
	Due int64
	// Scheduled rows are delayed tasks' rows whose time has not come.
	Scheduled int64
	// OldestDue is how long the longest-waiting due row has been due, by
	// the database's clock (0 when none is due).
	OldestDue time.Duration
}

// backlogOver reads a backlogPart from rows, a query of the unsent rows'
// due-since times (column since): the counts of the due and the scheduled
// ones, the earliest due-since time among the due ones (NULL: none) and
// the database's now().
func backlogOver(rows string) string {
	return `
SELECT count(*) FILTER (WHERE o.since <= now()), count(*) FILTER (WHERE o.since > now()),
       min(o.since) FILTER (WHERE o.since <= now()), now()
FROM (` + rows + `) o`
}

// backlogPart is what backlogOver reads: the Backlog of some unsent rows.
type backlogPart struct {
	due, scheduled int64
	oldest         pgtype.Timestamptz // the earliest due-since time of its due rows
	now            time.Time          // the database's
}

// fields are the destinations of backlogOver's columns.
func (p *backlogPart) fields() []any { return []any{&p.due, &p.scheduled, &p.oldest, &p.now} }

// and is the part of p's rows and q's, at p's time.
func (p backlogPart) and(q backlogPart) backlogPart {
	p.due, p.scheduled = p.due+q.due, p.scheduled+q.scheduled
	if q.oldest.Valid && (!p.oldest.Valid || q.oldest.Time.Before(p.oldest.Time)) {
		p.oldest = q.oldest
	}
	return p
}

// backlog is p as a Backlog, its age by p's time.
func (p backlogPart) backlog() Backlog {
	b := Backlog{Due: p.due, Scheduled: p.scheduled}
	if p.oldest.Valid {
		b.OldestDue = max(p.now.Sub(p.oldest.Time), 0)
	}
	return b
}

// unsentSinceSQL gives the due-since time of every unsent row of
// outbox_row, on the partial index outbox_event_claim_idx (whose
// predicate is the status condition). logUnsentSQL gives it for the rows
// of the outbox log that no round has taken yet (migration 00039), by
// the log's txid index past the position's snapshots (not from their
// xmin, which a transaction held open keeps back): their creation (they
// are due at once).
var (
	unsentSinceSQL = `SELECT ` + dueSinceSQL("e") + ` AS since FROM outbox_row e WHERE e.status IN ('NEW', 'RETRYING')`
	logUnsentSQL   = `SELECT l.created_at AS since FROM outbox_log_unsent l`
)

// backlogSQL reads the Backlog over every unsent row in one pass (the
// operator's reading; the gauges read in two parts, backlogReader).
// cappedBacklogSQL reads it over at most
// $1 of them, the first in due order on the claim index (so the due rows
// that never failed come first), for a page that must stay cheap on a
// huge backlog.
var (
	backlogSQL       = backlogOver(unsentSinceSQL + ` UNION ALL ` + logUnsentSQL)
	cappedBacklogSQL = backlogOver(`(` + unsentSinceSQL + ` ORDER BY e.next_retry_at, e.id LIMIT $1) UNION ALL (` +
		logUnsentSQL + ` LIMIT $1)`)
)

// RowQuerier is what the readings need: a pool, a connection or a pgx.Tx.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadBacklog reads the Backlog. limit > 0 reads at most that many unsent
// rows (when Due + Scheduled reaches it, there may be more); 0 reads them
// all.
func ReadBacklog(ctx context.Context, db RowQuerier, limit int) (Backlog, error) {
	var p backlogPart
	var row pgx.Row
	if limit > 0 {
		row = db.QueryRow(ctx, cappedBacklogSQL, limit)
	} else {
		row = db.QueryRow(ctx, backlogSQL)
	}
	if err := row.Scan(p.fields()...); err != nil {
		return Backlog{}, fmt.Errorf("read the outbox backlog: %w", err)
	}
	return p.backlog(), nil
}

// The gauges (backlogCollector) read the backlog at every scrape. Read
// from the front of outbox_event_claim_idx, as ReadBacklog does, a scrape
// walks an entry for every row sent since vacuum last reached the index:
// while a transaction is held open (a long report, a pg_dump), every row
// sent since it began, a scrape's time growing with the hold until it
// passes its timeout and the gauges go missing. So a backlogReader reads
// in two parts, split at a cutoff on next_retry_at: the rows before it
// (the tail: rows long due and still unsent, and the dead entries in
// front of them) once every frontEvery, when it also moves the cutoff to
// a frontEvery before the database's now(); the rows at or after it (the
// head: the recent and the scheduled ones) at every scrape, over at most
// two frontEvery of dead entries. Between two reads of the tail the
// gauges count its rows as they were at the last one: a tail row
// published since still counts, and a row committed since with a
// next_retry_at before the cutoff (a due time long past) counts from the
// next, at most frontEvery later.

// backlogHeadSQL reads the unsent rows due at or after the cutoff $1,
// and the log's;
// backlogTailSQL, those due before the cutoff now() less $1 ms, and
// returns that cutoff.
var (
	backlogHeadSQL = backlogOver(unsentSinceSQL + ` AND e.next_retry_at >= $1 UNION ALL ` + logUnsentSQL)
	backlogTailSQL = `
WITH c AS (SELECT now() - $1 * interval '1 millisecond' AS cutoff)
SELECT p.*, c.cutoff FROM c, LATERAL (` + backlogOver(unsentSinceSQL+` AND e.next_retry_at < c.cutoff`) + `) p`
)

// backlogReader reads the Backlog for the gauges in two parts (see
// above). It is safe for concurrent use.
type backlogReader struct {
	db    pgplan.Batcher
	every time.Duration

	mu     sync.Mutex
	cutoff time.Time // zero: the tail not read yet
	tailAt time.Time // when it was, by this process's clock
	tail   backlogPart
}

// read returns the Backlog: the head read now, with the tail read now when
// it was last read every ago or more.
func (r *backlogReader) read(ctx context.Context) (Backlog, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cutoff.IsZero() || time.Since(r.tailAt) >= r.every {
		var t backlogPart
		var cutoff time.Time
		if err := queryRowPlanned(ctx, r.db, backlogTailSQL, []any{r.every.Milliseconds()}, append(t.fields(), &cutoff)...); err != nil {
			return Backlog{}, fmt.Errorf("read the outbox backlog before %s: %w", r.every, err)
		}
		r.cutoff, r.tailAt, r.tail = cutoff, time.Now(), t
	}
	var h backlogPart
	if err := queryRowPlanned(ctx, r.db, backlogHeadSQL, []any{r.cutoff}, h.fields()...); err != nil {
		return Backlog{}, fmt.Errorf("read the outbox backlog: %w", err)
	}
	return h.and(r.tail).backlog(), nil
}
