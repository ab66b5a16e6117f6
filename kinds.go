package ingest

import (
	"context"
	"log/slog"
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

// admission applies the kinds' settings to the processor's starts: a task
// of a paused kind is parked instead of started, those of a limited kind
// start through task.Store.StartLimited, and the kind slots of finished
// runs are freed at once. It holds the kinds' settings as last read from
// Postgres.
type admission struct {
	store *task.Store
	log   *slog.Logger
	met   *metrics
	owner string        // lease owner of the starts (the consumer name)
	lease time.Duration // lease of the starts
	// unflushed: the starts of kinds without limits do not wait for the
	// WAL flush (task.Store.StartUnflushed), for a transport that
	// delivers an unsettled message again by itself (transport.redelivers),
	// so that a start a crash of PostgreSQL undoes is run again
	// (docs/ARCHITECTURE.md §2.4).
	unflushed bool

	mu     sync.Mutex
	at     time.Time
	cached map[string]task.Limits
	freeMu sync.Mutex
	// toFree holds, by kind, the tasks whose slots wait to be freed; a
	// kind is in it while its frees are under way (see freeKindSlots).
	toFree map[string][]uuid.UUID
	// freeing tracks the frees of kind slots under way.
	freeing sync.WaitGroup
}

// limits returns the paused and limited kinds, reading them again when
// the copy is older than kindsRefresh. A failed read keeps the last copy
// (a task of a kind paused meanwhile starts, as it would have a moment
// earlier; a kind limited meanwhile is limited by its next read;
// StartLimited itself reads the limits under the kind's lock).
func (a *admission) limits(ctx context.Context) map[string]task.Limits {
	c := a
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) < kindsRefresh {
		return c.cached
	}
	limits, err := a.store.KindLimits(ctx)
	if err != nil {
		a.log.Warn("reading the kinds' settings failed; using the last copy", "err", err)
		c.at = time.Now().Add(-kindsRefresh / 2) // try again soon
		return c.cached
	}
	c.at, c.cached = time.Now(), limits
	return limits
}

// parkPaused parks the tasks of ds whose kind is paused (task.Store.Park,
// which checks the kind of the task row under the kind's lock) and
// returns the ids of the tasks it parked.
func (a *admission) parkPaused(ctx context.Context, ds []delivery, limits map[string]task.Limits) map[uuid.UUID]bool {
	var ids []uuid.UUID
	for _, d := range ds {
		if limits[d.kind].Paused {
			ids = append(ids, d.taskID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	parked, err := a.store.Park(ctx, ids...)
	if err != nil {
		// They go to the start statement, as if not paused.
		a.log.Error("parking tasks of paused kinds failed; starting them", "count", len(ids), "err", err)
		return nil
	}
	out := make(map[uuid.UUID]bool, len(parked))
	for _, id := range parked {
		out[id] = true
	}
	if len(parked) > 0 {
		a.log.Debug("parked tasks of paused kinds", "count", len(parked))
	}
	return out
}

// start starts the tasks of ds (ids, in order): those of a limited
// kind through task.Store.StartLimited, one call per kind, the others in
// one task.Store.Start (StartUnflushed when a.unflushed).
func (a *admission) start(ctx context.Context, ds []delivery, ids []uuid.UUID, limits map[string]task.Limits) ([]task.StartResult, error) {
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
	start := a.store.Start
	if a.unflushed {
		start = a.store.StartUnflushed
	}
	if len(kinds) == 0 {
		return start(ctx, a.owner, a.lease, ids...)
	}
	out, err := start(ctx, a.owner, a.lease, plain...)
	if err != nil {
		return nil, err
	}
	for _, kind := range kinds {
		res, err := a.store.StartLimited(ctx, a.owner, a.lease, kind, limited[kind]...)
		if err != nil {
			return nil, err
		}
		for _, r := range res {
			if r.Outcome == task.Throttled || r.Outcome == task.ParkedAtLimit {
				a.met.throttled.WithLabelValues(kind).Inc()
			}
		}
		out = append(out, res...)
	}
	return out, nil
}

// freeKindSlots gives back, off the caller's path, the kind slots held by
// finished runs and hands them to parked tasks of their kinds
// (task.Store.FreeSlots): done lists the tasks whose runs ended, by kind;
// only concurrency-limited kinds hold slots. The leader's releaser does
// the same for slots freed otherwise (an expired lease) and for rate
// limits; this makes a freed slot used at once. (The room a run frees in
// its group's window is handed on by the statement that records its end:
// see task/group.go.) ctx is the worker's I/O; wait waits for the frees
// under way.
//
// A worker frees one kind's slots one call at a time: the ends that
// arrive while a call is under way are freed together by the next one.
// Each call's release takes the kind's row lock, which the kind's other
// releases (and, with a limit of its own, its starts) wait for, so a
// call per batch of ends would queue as many holders of it as the worker
// completes batches.
func (a *admission) freeKindSlots(ctx context.Context, done map[string][]uuid.UUID) {
	limits := a.limits(ctx)
	a.freeMu.Lock()
	defer a.freeMu.Unlock()
	for kind, ids := range done {
		if !limits[kind].HoldsSlots() {
			continue
		}
		if a.toFree == nil {
			a.toFree = map[string][]uuid.UUID{}
		}
		_, running := a.toFree[kind]
		a.toFree[kind] = append(a.toFree[kind], ids...)
		if running {
			continue
		}
		a.freeing.Add(1)
		go a.freeSlots(ctx, kind)
	}
}

// freeSlots frees the slots of kind that freeKindSlots gathered, until
// none are left.
func (a *admission) freeSlots(ctx context.Context, kind string) {
	defer a.freeing.Done()
	for {
		a.freeMu.Lock()
		ids := a.toFree[kind]
		if len(ids) == 0 {
			delete(a.toFree, kind)
			a.freeMu.Unlock()
			return
		}
		a.toFree[kind] = nil // the key stays: a free is under way
		a.freeMu.Unlock()
		if _, err := a.store.FreeSlots(ctx, kind, ids...); err != nil {
			a.log.Warn("freeing the slots of finished runs failed; a later start or the leader's releaser frees them", "kind", kind, "err", err)
		}
	}
}

// wait waits for the frees of kind slots under way.
func (a *admission) wait() { a.freeing.Wait() }
