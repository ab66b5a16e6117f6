package ingest

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// kindsRefresh is how often a worker reads the kinds' settings: a pause or
// a limit takes effect in every worker within about this long.
const kindsRefresh = time.Second

// throttleRetry is when a worker looks again at an entry whose task a
// limit kept from being taken over (it could not be parked: see
// task.Store.StartLimited).
const throttleRetry = time.Second

// kindCache holds the paused and limited kinds as last read from Postgres.
type kindCache struct {
	mu     sync.Mutex
	at     time.Time
	limits map[string]task.Limits
}

// kindLimits returns the paused and limited kinds, reading them again
// when the copy is older than kindsRefresh. A failed read keeps the last
// copy (a task of a kind paused meanwhile starts, as it would have a
// moment earlier; a kind limited meanwhile is limited by its next read;
// StartLimited itself reads the limits under the kind's lock).
func (p *processor) kindLimits(ctx context.Context) map[string]task.Limits {
	c := &p.kinds
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < kindsRefresh {
		return c.limits
	}
	limits, err := p.store.KindLimits(ctx)
	if err != nil {
		p.log.Warn("reading the kinds' settings failed; using the last copy", "err", err)
		c.at = time.Now().Add(-kindsRefresh / 2) // try again soon
		return c.limits
	}
	c.at, c.limits = time.Now(), limits
	return limits
}

// parkPaused parks the tasks of ds whose kind is paused (task.Store.Park,
// which checks the kind of the task row under the kind's lock) and
// returns the ids of the tasks it parked.
func (p *processor) parkPaused(ctx context.Context, ds []delivery, limits map[string]task.Limits) map[uuid.UUID]bool {
	var ids []uuid.UUID
	for _, d := range ds {
		if limits[d.kind].Paused {
			ids = append(ids, d.taskID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	parked, err := p.store.Park(ctx, ids...)
	if err != nil {
		// They go to the start statement, as if not paused.
		p.log.Error("parking tasks of paused kinds failed; starting them", "count", len(ids), "err", err)
		return nil
	}
	out := make(map[uuid.UUID]bool, len(parked))
	for _, id := range parked {
		out[id] = true
	}
	if len(parked) > 0 {
		p.log.Debug("parked tasks of paused kinds", "count", len(parked))
	}
	return out
}

// startAll starts the tasks of ds (ids, in order): those of a limited
// kind through task.Store.StartLimited, one call per kind, the others in
// one task.Store.Start.
func (p *processor) startAll(ctx context.Context, ds []delivery, ids []uuid.UUID, limits map[string]task.Limits) ([]task.StartResult, error) {
	var plain []uuid.UUID
	var kinds []string
	limited := map[string][]uuid.UUID{}
	for i, d := range ds {
		if !limits[d.kind].Limited() {
			plain = append(plain, ids[i])
			continue
		}
		if _, ok := limited[d.kind]; !ok {
			kinds = append(kinds, d.kind)
		}
		limited[d.kind] = append(limited[d.kind], ids[i])
	}
	if len(kinds) == 0 {
		return p.store.Start(ctx, p.cfg.Consumer, p.cfg.TaskLease, ids...)
	}
	out, err := p.store.Start(ctx, p.cfg.Consumer, p.cfg.TaskLease, plain...)
	if err != nil {
		return nil, err
	}
	for _, kind := range kinds {
		res, err := p.store.StartLimited(ctx, p.cfg.Consumer, p.cfg.TaskLease, kind, limited[kind]...)
		if err != nil {
			return nil, err
		}
		for _, r := range res {
			if r.Outcome == task.Throttled || r.Outcome == task.ParkedAtLimit {
				p.met.throttled.WithLabelValues(kind).Inc()
			}
		}
		out = append(out, res...)
	}
	return out, nil
}

// releaseSlots gives back the slots held by finished runs and hands them
// to parked tasks of their kinds (task.Store.FreeSlots): freed lists the
// tasks of each concurrency-limited kind whose runs ended. The leader's
// releaser does the same for slots freed otherwise (an expired lease) and
// for rate limits; this makes a freed slot used at once.
func (p *processor) releaseSlots(ctx context.Context, freed map[string][]uuid.UUID) {
	for kind, ids := range freed {
		if _, err := p.store.FreeSlots(ctx, kind, ids...); err != nil {
			p.log.Warn("freeing the slots of finished runs failed; a later start or the leader's releaser frees them", "kind", kind, "err", err)
		}
	}
}
