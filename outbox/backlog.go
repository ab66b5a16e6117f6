package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

// backlogOver reads the Backlog from rows, a query of the unsent rows'
// due-since times (column since).
func backlogOver(rows string) string {
	return `
SELECT count(*) FILTER (WHERE o.since <= now()), count(*) FILTER (WHERE o.since > now()),
       coalesce(extract(epoch FROM now() - min(o.since) FILTER (WHERE o.since <= now())), 0)::float8
FROM (` + rows + `) o`
}

// unsentSinceSQL gives the due-since time of every unsent row, on the
// partial index outbox_event_claim_idx (whose predicate is the status
// condition).
var unsentSinceSQL = `SELECT ` + dueSinceSQL("e") + ` AS since FROM outbox_event e WHERE e.status IN ('NEW', 'RETRYING')`

// backlogSQL reads the Backlog over every unsent row in one pass: the
// gauges read it at every scrape. cappedBacklogSQL reads it over at most
// $1 of them, the first in due order on the claim index (so the due rows
// that never failed come first), for a page that must stay cheap on a
// huge backlog.
var (
	backlogSQL       = backlogOver(unsentSinceSQL)
	cappedBacklogSQL = backlogOver(unsentSinceSQL + ` ORDER BY e.next_retry_at, e.id LIMIT $1`)
)

// RowQuerier is what the readings need: a pool, a connection or a pgx.Tx.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadBacklog reads the Backlog. limit > 0 reads at most that many unsent
// rows (when Due + Scheduled reaches it, there may be more); 0 reads them
// all.
func ReadBacklog(ctx context.Context, db RowQuerier, limit int) (Backlog, error) {
	var b Backlog
	var age float64
	var row pgx.Row
	if limit > 0 {
		row = db.QueryRow(ctx, cappedBacklogSQL, limit)
	} else {
		row = db.QueryRow(ctx, backlogSQL)
	}
	if err := row.Scan(&b.Due, &b.Scheduled, &age); err != nil {
		return Backlog{}, fmt.Errorf("read the outbox backlog: %w", err)
	}
	b.OldestDue = time.Duration(age * float64(time.Second))
	return b, nil
}
