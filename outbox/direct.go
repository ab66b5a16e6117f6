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
// handler start. A writer that owns its transaction can skip the first two
// (Writer decides when): insertClaimed writes the outbox rows already
// claimed by a running relay, under that relay's lease, and once the
// transaction has committed Claim.Publish hands them to the relay, which
// XADDs and marks them at once. Nothing else changes: the rows are
// ordinary claimed rows, so if the process dies before they are published
// any relay publishes them when the lease expires, and a failed XADD is
// retried by the relays with backoff like any other.
//
// A relay takes at most DirectBacklog claims at a time; beyond that, and
// while it is not running, insertClaimed writes unclaimed rows, which go
// the usual way.
//
// Publishing after commit (reserve, Writer's PublishAfterCommit) goes one
// step further: the transaction writes no outbox row at all. Once it has
// committed, Claim.Publish hands the tasks to the relay, which XADDs them
// and then writes each task's row once, already SENT with its entry id (or
// RETRYING with the error, for the relays to retry like any failed row). A
// row inserted and later updated to SENT writes every index of
// outbox_event twice, the claim index once more; written once, SENT, it
// costs half. The price is the window between the commit and the XADD: a
// process that dies in it leaves tasks with no outbox row and no entry,
// which only the rescuer (package maintenance) finds, once its grace has
// passed; the relay's lease does not cover them. So it is for tasks just
// created (no row of their own yet), in a process whose deployment runs
// the rescuer (Redis mode); claimed rows need nothing but relays.

// Querier is what Writer needs of a transaction: a pgx.Tx, usually.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Execer
}

// Claim is a batch of outbox rows written claimed by a relay (see
// insertClaimed), or of tasks whose rows the relay writes once they are
// published (see reserve): what a Writer staged for after the commit. The
// zero Claim holds nothing. Call exactly one of Publish (the transaction
// committed) and Discard (it did not).
type Claim struct {
	relay *Relay
	c     claimed
}

// reserve takes room in r for msgs, tasks that the caller's transaction is
// creating, and writes nothing: once the transaction has committed,
// Claim.Publish hands them to r, which publishes them and writes each
// task's outbox row once, SENT (see the note on direct publishing above
// for what a crash before the XADD leaves). ok is false when r is not
// running or has no room (see DirectBacklog): the caller then writes the
// rows the usual way (Insert).
func (r *Relay) reserve(msgs []Message) (c Claim, ok bool) {
	if len(msgs) == 0 || !r.takeSlot() {
		return Claim{}, false
	}
	rows := make([]row, len(msgs))
	for i, m := range msgs {
		rows[i] = row{taskID: m.TaskID, stream: m.Stream, kind: m.Kind, traceparent: m.Traceparent, priority: m.Priority}
	}
	return Claim{relay: r, c: claimed{rows: rows, unwritten: true}}, true
}

// takeSlot takes one of the DirectBacklog slots of direct publishing, if
// r is running and one is free; the claim that holds it frees it once
// published or discarded.
func (r *Relay) takeSlot() bool {
	if !r.running.Load() {
		return false
	}
	select {
	case r.directSlots <- struct{}{}:
		return true
	default:
		return false
	}
}

// insertClaimedSQL writes one row per task $1 (to streams $2) claimed by
// relay $3 for $4 ms.
const insertClaimedSQL = `
INSERT INTO outbox_row (task_id, stream, claimed_by, claimed_until)
SELECT id, s, $3, now() + $4 * interval '1 millisecond' FROM unnest($1::uuid[], $2::text[]) AS t(id, s)
RETURNING id, task_id, created_at, claimed_until`

// insertClaimed writes one outbox row per message in db's transaction,
// like Insert, but claimed by r when r is running and has room (see
// DirectBacklog); the returned Claim then holds the rows, for Publish once
// the transaction has committed. Otherwise the rows are written unclaimed
// and the Claim is zero.
func (r *Relay) insertClaimed(ctx context.Context, db Querier, msgs []Message) (Claim, error) {
	if len(msgs) == 0 {
		return Claim{}, nil
	}
	if !r.takeSlot() {
		return Claim{}, insertMessages(ctx, db, msgs)
	}
	byTask := make(map[uuid.UUID]Message, len(msgs))
	streams := make([]string, len(msgs))
	for i, m := range msgs {
		byTask[m.TaskID], streams[i] = m, m.Stream
	}
	c := claimed{rows: make([]row, 0, len(msgs))}
	rows, err := db.Query(ctx, insertClaimedSQL, taskIDs(msgs), streams, r.cfg.ID, r.cfg.Lease.Milliseconds())
	if err == nil {
		var rw row
		_, err = pgx.ForEachRow(rows, []any{&rw.id, &rw.taskID, &rw.createdAt, &c.until}, func() error {
			m := byTask[rw.taskID]
			rw.stream, rw.kind, rw.traceparent, rw.priority = m.Stream, m.Kind, m.Traceparent, m.Priority
			c.rows = append(c.rows, rw)
			return nil
		})
	}
	if err != nil {
		<-r.directSlots
		return Claim{}, fmt.Errorf("insert %d claimed outbox events: %w", len(msgs), err)
	}
	return Claim{relay: r, c: c}, nil
}

// taskIDs returns the task ids of msgs.
func taskIDs(msgs []Message) []uuid.UUID {
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		ids[i] = m.TaskID
	}
	return ids
}

// Publish hands the claim, whose transaction has committed, to its relay,
// which publishes the rows at once. It does not wait. A claim handed over
// after the relay's Run has returned (a shutdown racing the commit) is
// published by a relay once its lease expires, or, for a reserve, by the
// rescuer once its grace has passed (the tasks have no row).
func (c Claim) Publish() {
	if c.relay != nil {
		c.c.committed = time.Now()
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
				if p.c.unwritten {
					r.writeDirect(ctx, p.c, p.ids, p.errs)
					<-r.directSlots
					continue
				}
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

// insertSentSQL writes the rows of tasks published after their commit
// ($1, to streams $2), SENT with their entry ids $3.
const insertSentSQL = `
INSERT INTO outbox_row (task_id, stream, status, stream_id, sent_at)
SELECT id, s, 'SENT', sid, now() FROM unnest($1::uuid[], $2::text[], $3::text[]) AS t(id, s, sid)`

// insertFailedSQL writes the rows of tasks ($1, to streams $2) whose first
// publish after their commit failed (errors $3), as markFailedSQL would
// have marked them after one failed attempt: DEAD when $4 (max attempts) is
// 1, else RETRYING, due after package backoff's delay for one failure
// (base $5, max $6 in ms, jitter $7). The relays retry them.
var insertFailedSQL = `
INSERT INTO outbox_row (task_id, stream, status, attempt_count, next_retry_at, last_error)
SELECT id, s, ` + failedStatusSQL("1", "$4") + `, 1,
       ` + failedRetryAtSQL("1", "$4", "$5", "$6", "$7") + `, e
FROM unnest($1::uuid[], $2::text[], $3::text[]) AS t(id, s, e)
RETURNING status`

// writeDirect writes the outbox rows of a reserved claim after its XADDs:
// SENT with their entry ids, or failed (see insertFailedSQL). A row it
// cannot write leaves its task to the rescuer: published ones are then
// published again (a duplicate entry, harmless), failed ones for the
// first time.
func (r *Relay) writeDirect(ctx context.Context, c claimed, ids []string, errs []error) {
	if r.afterPublish != nil {
		r.afterPublish()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	res := DrainResult{Claimed: len(c.rows)}
	sent, sentIDs, failed, failMsgs := splitPublished(c.rows, ids, errs)
	if len(sent) > 0 {
		taskIDs, streams := targets(sent)
		for i, rw := range sent {
			streams[i] = r.dest(rw) // a published row names its entry's stream
		}
		if _, err := r.pool.Exec(ctx, insertSentSQL, taskIDs, streams, sentIDs); err != nil {
			r.logger.Error("outbox direct publish: writing the SENT rows of published tasks failed; the rescuer publishes them again after its grace",
				"rows", len(sent), "err", err)
		} else {
			res.Published = len(sent)
			delay := time.Since(c.committed).Seconds()
			for range sent {
				r.metrics.publishDelay.Observe(delay)
			}
			r.metrics.publishTotal.WithLabelValues(resultSuccess).Add(float64(len(sent)))
		}
	}
	if len(failed) > 0 {
		taskIDs, streams := targets(failed)
		baseMS, maxMS, jitter := r.cfg.Backoff.SQLArgs()
		rows, err := r.pool.Query(ctx, insertFailedSQL, taskIDs, streams, failMsgs, r.cfg.MaxAttempts, baseMS, maxMS, jitter)
		var statuses []string
		if err == nil {
			statuses, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			r.logger.Error("outbox direct publish: writing the rows of tasks whose publish failed failed too; the rescuer publishes them after its grace",
				"rows", len(failed), "err", err)
		} else {
			res.Retried, res.Dead = r.countFailed(statuses)
		}
	}
	r.logPass(res, failMsgs)
}

// targets returns the task ids and streams of rows.
func targets(rows []row) (taskIDs []uuid.UUID, streams []string) {
	for _, rw := range rows {
		taskIDs, streams = append(taskIDs, rw.taskID), append(streams, rw.stream)
	}
	return taskIDs, streams
}
