package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Direct publishing.
//
// The usual way from a commit to the stream takes a NOTIFY, a relay's claim
// statement and its XADD: at light load, most of the time from commit to
// handler start. A writer that owns its transaction can skip the first two:
// InsertClaimed writes the outbox rows already claimed by a running relay,
// under that relay's lease, and once the transaction has committed
// Claim.Publish hands them to the relay, which XADDs and marks them at
// once. Nothing else changes: the rows are ordinary claimed rows, so if
// the process dies before they are published any relay publishes them when
// the lease expires, and a failed XADD is retried by the relays with
// backoff like any other.
//
// A relay takes at most DirectBacklog claims at a time; beyond that, and
// while it is not running, InsertClaimed writes unclaimed rows, which go the
// usual way.

// Querier is what InsertClaimed needs: a pgx.Tx, usually.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Execer
}

// Claim is a batch of outbox rows written claimed by a relay (see
// InsertClaimed). The zero Claim holds nothing. Call exactly one of
// Publish (the transaction committed) and Discard (it did not).
type Claim struct {
	relay *Relay
	c     claimed
}

// insertClaimedSQL also reads each task's traceparent (the tasks were
// written earlier in the same transaction).
const insertClaimedSQL = `
WITH ins AS (
    INSERT INTO outbox_event (task_id, stream, claimed_by, claimed_until)
    SELECT id, $2, $3, now() + $4 * interval '1 millisecond' FROM unnest($1::uuid[]) AS t(id)
    RETURNING id, task_id, created_at, claimed_until
)
SELECT ins.id, ins.task_id, ins.created_at, ins.claimed_until, coalesce(t.traceparent, '')
FROM ins LEFT JOIN ingest_task t ON t.id = ins.task_id`

// InsertClaimed writes one outbox row per task (taskIDs[i] of kind
// kinds[i]) to stream in db's transaction, like Insert, but claimed by r
// when r is running and has room (see DirectBacklog); the returned Claim
// then holds the rows, for Publish once the transaction has committed.
// Otherwise the rows are written unclaimed and the Claim is zero.
func (r *Relay) InsertClaimed(ctx context.Context, db Querier, stream string, taskIDs []uuid.UUID, kinds []string) (Claim, error) {
	if len(taskIDs) == 0 {
		return Claim{}, nil
	}
	if len(kinds) != len(taskIDs) {
		return Claim{}, fmt.Errorf("insert claimed outbox events: %d task ids but %d kinds", len(taskIDs), len(kinds))
	}
	if !r.running.Load() {
		return Claim{}, Insert(ctx, db, stream, taskIDs...)
	}
	select {
	case r.directSlots <- struct{}{}:
	default:
		return Claim{}, Insert(ctx, db, stream, taskIDs...)
	}
	kindOf := make(map[uuid.UUID]string, len(taskIDs))
	for i, id := range taskIDs {
		kindOf[id] = kinds[i]
	}
	c := claimed{rows: make([]row, 0, len(taskIDs))}
	rows, err := db.Query(ctx, insertClaimedSQL, taskIDs, stream, r.cfg.ID, r.cfg.Lease.Milliseconds())
	if err == nil {
		var rw row
		_, err = pgx.ForEachRow(rows, []any{&rw.id, &rw.taskID, &rw.createdAt, &c.until, &rw.traceparent}, func() error {
			rw.stream, rw.kind = stream, kindOf[rw.taskID]
			c.rows = append(c.rows, rw)
			return nil
		})
	}
	if err != nil {
		<-r.directSlots
		return Claim{}, fmt.Errorf("insert %d claimed outbox events: %w", len(taskIDs), err)
	}
	return Claim{relay: r, c: c}, nil
}

// Publish hands the claim, whose transaction has committed, to its relay,
// which publishes the rows at once. It does not wait. A claim handed over
// after the relay's Run has returned (a shutdown racing the commit) is
// published by a relay once its lease expires.
func (c Claim) Publish() {
	if c.relay != nil {
		c.relay.direct <- c.c // never blocks: the claim holds one of the slots
	}
}

// Discard gives up the claim of a transaction that did not commit.
func (c Claim) Discard() {
	if c.relay != nil {
		<-c.relay.directSlots
	}
}

// publishDirect publishes the claims handed over by Publish until ctx is
// cancelled, then those already handed over, and returns once all are
// marked. Each round XADDs every claim waiting, in one pipelined round
// trip, and leaves the marking to Parallel other goroutines, so a claim
// never waits behind another's update.
func (r *Relay) publishDirect(ctx context.Context) {
	type published struct {
		c    claimed
		ids  []string
		errs []error
	}
	// Never full: every claim in it holds one of the DirectBacklog slots.
	marks := make(chan published, r.cfg.DirectBacklog)
	var wg sync.WaitGroup
	for range r.cfg.Parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range marks {
				if _, err := r.record(ctx, p.c, p.ids, p.errs); err != nil {
					r.logger.Error("outbox direct publish: marking rows failed; they are published again once their claim expires",
						"rows", len(p.c.rows), "claimed_until", p.c.until.Format(time.RFC3339Nano), "err", err)
				}
				<-r.directSlots
			}
		}()
	}
	defer wg.Wait()
	defer close(marks)

	var batch []claimed
	var rows []row
	for {
		batch = batch[:0]
		select {
		case c := <-r.direct:
			batch = append(batch, c)
		case <-ctx.Done():
		}
	more:
		for len(batch) < r.cfg.DirectBacklog {
			select {
			case c := <-r.direct:
				batch = append(batch, c)
			default:
				break more
			}
		}
		if len(batch) == 0 {
			return // cancelled, and nothing was handed over
		}
		rows = rows[:0]
		for _, c := range batch {
			rows = append(rows, c.rows...)
		}
		pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
		ids, errs := r.publish(pubCtx, rows)
		cancel()
		for _, c := range batch {
			n := len(c.rows)
			marks <- published{c: c, ids: ids[:n:n], errs: errs[:n:n]}
			ids, errs = ids[n:], errs[n:]
		}
	}
}
