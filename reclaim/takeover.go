package reclaim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Taking over the entries of expired leases (see the package
// documentation): a consumer that has not been heard from for LeaseIdle,
// an entry of it idle for LeaseIdle, a task RUNNING under a lease that
// expired.

// takeoverPage is how many pending entries of a consumer one XPENDING
// reads; takeoverScan bounds the entries a round looks at, over all
// consumers (the next round goes on from where this one stopped).
const (
	takeoverPage = 100
	takeoverScan = 1000
)

// takeOver claims, for this consumer, the pending entries of tasks whose
// lease expired from the consumers that have been silent for LeaseIdle, and
// hands them to the sink, within its free slots.
func (r *Reclaimer) takeOver(ctx context.Context, res *roundResult) {
	consumers, err := r.rdb.XInfoConsumers(ctx, r.cur.key, r.cfg.Group).Result()
	if err != nil {
		if ctx.Err() == nil && !stream.IsNoGroup(err) {
			r.metrics.add(resultError, 1)
			r.logger.Error("list consumers for the takeover of expired leases", "err", fmt.Errorf("xinfo consumers %s: %w", r.cur.key, err))
		}
		return
	}
	silent := map[string]bool{}
	for _, c := range consumers {
		if c.Name != r.cfg.Consumer && c.Pending > 0 && sinceHeardFrom(c) >= r.cfg.LeaseIdle {
			silent[c.Name] = true
		}
	}
	for name := range r.takeoverFrom {
		if !silent[name] {
			delete(r.takeoverFrom, name) // heard from again, or gone
		}
	}
	names := make([]string, 0, len(silent))
	for name := range silent {
		names = append(names, name)
	}
	slices.Sort(names)
	budget := takeoverScan
	for _, name := range names {
		if budget <= 0 || ctx.Err() != nil || !r.takeOverFrom(ctx, name, &budget, res) {
			return
		}
	}
}

// sinceHeardFrom is how long ago consumer c last read or claimed an entry
// (the heartbeat's XCLAIM of its running entries counts). Redis 7.2 reports
// it as "inactive" and counts a read that found nothing in "idle"; before
// 7.2 there is no "inactive" and "idle" is it. A worker that runs tasks is
// heard from every third of its lease; one with nothing to run may look
// silent, which only costs a look at its pending entries.
func sinceHeardFrom(c redis.XInfoConsumer) time.Duration {
	return max(c.Idle, c.Inactive)
}

// takeOverFrom pages through the pending entries of consumer idle for
// LeaseIdle, from where the last round stopped, and takes over those of
// expired leases. It reports false when the sink had no room left.
func (r *Reclaimer) takeOverFrom(ctx context.Context, consumer string, budget *int, res *roundResult) bool {
	start := r.takeoverFrom[consumer]
	if start == "" {
		start = "-"
	}
	for *budget > 0 && ctx.Err() == nil {
		count := min(takeoverPage, *budget)
		ps, err := r.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: r.cur.key, Group: r.cfg.Group, Idle: r.cfg.LeaseIdle,
			Start: start, End: "+", Count: int64(count), Consumer: consumer,
		}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			r.takeoverFailed(ctx, consumer, fmt.Errorf("xpending %s %s %s: %w", r.cur.key, r.cfg.Group, consumer, err))
			return true
		}
		*budget -= len(ps)
		ids := make([]string, len(ps))
		for i, p := range ps {
			ids[i] = p.ID
		}
		claimable, err := r.expiredLeaseEntries(ctx, ids)
		if err != nil {
			r.takeoverFailed(ctx, consumer, err)
			return true
		}
		if len(claimable) > 0 {
			n := r.reserve(ctx, len(claimable))
			if n == 0 {
				res.Skipped = true
				r.takeoverFrom[consumer] = start // this page again next round
				return false
			}
			msgs, err := r.rdb.XClaim(ctx, &redis.XClaimArgs{
				Stream: r.cur.key, Group: r.cfg.Group, Consumer: r.cfg.Consumer,
				MinIdle: r.cfg.LeaseIdle, Messages: claimable[:n],
			}).Result()
			if err != nil {
				r.sink.Process(ctx, nil, n) // give the slots back
				r.takeoverFailed(ctx, consumer, fmt.Errorf("xclaim %s %s: %w", r.cur.key, r.cfg.Group, err))
				return true
			}
			r.hand(ctx, r.qualify(msgs), n)
			res.TakenOver += len(msgs)
			r.metrics.add(resultTakeover, len(msgs))
			for _, m := range msgs {
				r.logger.Info("taking over a task whose lease expired from a silent consumer", "from", consumer, "message_id", m.ID,
					"task_id", stream.FieldString(m, stream.FieldTaskID))
			}
			if n < len(claimable) {
				res.Skipped = true
				r.takeoverFrom[consumer] = start
				return false
			}
		}
		if len(ps) < count {
			delete(r.takeoverFrom, consumer) // scanned to the end
			return true
		}
		start = nextID(ps[len(ps)-1].ID)
		r.takeoverFrom[consumer] = start
	}
	return true
}

// expiredLeaseEntries returns those of the pending entry ids whose task is
// RUNNING under a lease that expired and not this consumer's (task.ExpiredLeases),
// reading each entry's task id (one pipelined XRANGE per id). Entries gone
// from the stream, and entries of no valid task, are left to XAUTOCLAIM.
func (r *Reclaimer) expiredLeaseEntries(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.XMessageSliceCmd, len(ids))
	_, err := r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.XRangeN(ctx, r.cur.key, id, id, 1)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("xrange %s (%d entries): %w", r.cur.key, len(ids), err)
	}
	taskOf := make([]uuid.UUID, len(ids))
	var taskIDs []uuid.UUID
	for i, cmd := range cmds {
		ms := cmd.Val()
		if len(ms) != 1 || ms[0].ID != ids[i] {
			continue // deleted or trimmed
		}
		if e, err := stream.ParseEntry(ms[0]); err == nil {
			taskOf[i] = e.TaskID
			taskIDs = append(taskIDs, e.TaskID)
		}
	}
	expired, err := task.ExpiredLeases(ctx, r.db, r.cfg.Consumer, taskIDs)
	if err != nil || len(expired) == 0 {
		return nil, err
	}
	var out []string
	for i, id := range ids {
		if taskOf[i] != uuid.Nil && slices.Contains(expired, taskOf[i]) {
			out = append(out, id)
		}
	}
	return out, nil
}

func (r *Reclaimer) takeoverFailed(ctx context.Context, consumer string, err error) {
	if ctx.Err() != nil || stream.IsNoGroup(err) {
		return
	}
	r.metrics.add(resultError, 1)
	r.logger.Error("take over the entries of expired leases", "from", consumer, "err", err)
}

// nextID returns the smallest entry id after id ("ms-seq").
func nextID(id string) string {
	msPart, seqPart, _ := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(msPart, 10, 64)
	seq, err2 := strconv.ParseUint(seqPart, 10, 64)
	switch {
	case err1 != nil || err2 != nil:
		return id // not an entry id: XPENDING would have refused it
	case seq == ^uint64(0):
		return strconv.FormatUint(ms+1, 10) + "-0"
	}
	return msPart + "-" + strconv.FormatUint(seq+1, 10)
}
