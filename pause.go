package ingest

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
)

// pausedRefresh is how often a worker reads the paused kinds: a pause
// takes effect in every worker within about this long.
const pausedRefresh = time.Second

// pausedCache holds the paused kinds as last read from Postgres.
type pausedCache struct {
	mu    sync.Mutex
	at    time.Time
	kinds map[string]bool
}

// pausedKinds returns the paused kinds, reading them again when the copy
// is older than pausedRefresh. A failed read keeps the last copy (the
// start statement's guards do not depend on it: a task of a kind paused
// meanwhile starts, as it would have a moment earlier).
func (p *processor) pausedKinds(ctx context.Context) map[string]bool {
	c := &p.paused
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < pausedRefresh {
		return c.kinds
	}
	kinds, err := p.store.PausedKinds(ctx)
	if err != nil {
		p.log.Warn("reading the paused kinds failed; using the last copy", "err", err)
		c.at = time.Now().Add(-pausedRefresh / 2) // try again soon
		return c.kinds
	}
	c.at, c.kinds = time.Now(), kinds
	return kinds
}

// parkPaused parks the tasks of ds whose kind is paused (task.Store.Park,
// which checks the kind of the task row under the kind's lock) and
// returns the ids of the tasks it parked.
func (p *processor) parkPaused(ctx context.Context, ds []delivery) map[uuid.UUID]bool {
	paused := p.pausedKinds(ctx)
	if len(paused) == 0 {
		return nil
	}
	var ids []uuid.UUID
	for _, d := range ds {
		if paused[d.kind] {
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
