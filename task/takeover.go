package task

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/pgplan"
)

// expiredLeasesSQL returns those of the tasks $1 that are RUNNING under a
// lease that expired (expiredLease), except the ones whose lease is $2's,
// reaching them through the primary key only.
var expiredLeasesSQL = `
SELECT t.id FROM unnest($1::uuid[]) AS c(id) JOIN ingest_task t ON t.id = c.id
WHERE ` + expiredLease("t") + ` AND t.lease_owner IS DISTINCT FROM $2
ORDER BY t.id`

// ExpiredLeases returns those of ids that are RUNNING under a lease that
// has expired: the lease is the authority on whether a run's worker lives,
// so these may be taken over (package reclaim claims their pending
// entries; the start's takeover then counts the abandoned run as a failed
// attempt). A task whose lease owner is self is left out: that consumer is
// the caller's own, whose run may still go on (a handler abandoned past its
// timeout, or lease renewals that cannot reach Postgres), and a second run
// under the same owner could not be told apart from the first by the
// completion guard. Its takeover is left to another consumer.
func ExpiredLeases(ctx context.Context, db DB, self string, ids []uuid.UUID) ([]uuid.UUID, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := pgplan.Query(ctx, db, expiredLeasesSQL, ids, self)
	if err != nil {
		return nil, fmt.Errorf("find expired leases among %d tasks: %w", len(ids), err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("find expired leases among %d tasks: %w", len(ids), err)
	}
	return out, nil
}
