package task

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/pgsession"
)

// DoneChannel is the channel that announces the tasks that ended
// (SUCCEEDED, DEAD, CANCELLED) and that an Awaiter waits for: the audit
// table's trigger ingest_task_ended (migration 00034) sends, at the commit
// of a statement that writes a terminal audit row of a task registered in
// ingest_task_awaited, the ids of those tasks, comma-separated, at most
// 200 to a notification. A statement that ends no awaited task sends
// none: PostgreSQL serializes the commits of notifying transactions, and
// the completions of a pool of workers would queue on it.
const DoneChannel = "ingest_task_done"

// Defaults of an Awaiter.
const (
	// DefaultAwaitFallback is how often an Awaiter whose LISTEN works
	// also reads the state of every awaited task (one query for all): a
	// notification lost with a connection cannot keep a waiter past its
	// own deadline for longer than that.
	DefaultAwaitFallback = 5 * time.Second
	// DefaultAwaitPoll is that interval while nothing LISTENs (no direct
	// connection behind a pooler, or the connection is being
	// re-established).
	DefaultAwaitPoll = time.Second
	// awaitIdle is how long an Awaiter keeps its connection without a
	// waiter before it closes it (the next Wait opens it again).
	awaitIdle = time.Minute
	// awaitRetryMax bounds the pause before re-opening a lost LISTEN.
	awaitRetryMax = 5 * time.Second
	// awaitRecheck is when a Wait reads its task once more after it
	// registered it: a statement that ended the task after the
	// registration began but before it committed did not see it, and
	// announced nothing.
	awaitRecheck = time.Second
	// awaitHold is how many state checks' intervals a registration lasts
	// without being renewed (each check renews those of every waited
	// task): an Awaiter that stopped without removing its own leaves them
	// to the next check of any Awaiter.
	awaitHold = 3
)

// awaitApplicationName names an Awaiter's connection in pg_stat_activity.
const awaitApplicationName = "ingest-task-awaiter"

// Awaiter waits for tasks to end. One Awaiter serves any number of
// concurrent waits with one LISTEN connection on DoneChannel (opened at
// the first Wait, closed after a minute without waiters), fanning each
// notification out to the waiters of its ids; it also reads the state of
// all awaited tasks in one query every Fallback (Poll while it cannot
// LISTEN), so a lost notification delays a waiter by at most that.
type Awaiter struct {
	store *Store
	log   *slog.Logger
	// Fallback and Poll are the intervals of the state check with and
	// without a LISTEN (DefaultAwaitFallback, DefaultAwaitPoll when 0).
	Fallback, Poll time.Duration

	mu        sync.Mutex
	waiters   map[uuid.UUID]map[chan struct{}]struct{}
	running   bool
	listening bool
	stop      context.CancelFunc
	done      chan struct{}
}

// NewAwaiter returns an Awaiter of store's tasks; log (nil: discarded)
// receives its connection troubles.
func NewAwaiter(store *Store, log *slog.Logger) *Awaiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Awaiter{store: store, log: log, waiters: map[uuid.UUID]map[chan struct{}]struct{}{}}
}

// Wait returns task id once it is terminal (SUCCEEDED, DEAD or
// CANCELLED). When ctx ends first it returns the task as last read with
// ctx's error; ErrNotFound for an unknown task.
//
// It registers the task in ingest_task_awaited first, so that the
// statement that ends it announces it; a registration that fails leaves
// the wait to the state checks.
func (a *Awaiter) Wait(ctx context.Context, id uuid.UUID) (Task, error) {
	ch := make(chan struct{}, 1)
	a.add(id, ch)
	defer a.remove(id, ch)
	if err := a.register(ctx, []uuid.UUID{id}); err != nil && ctx.Err() == nil {
		a.log.Warn("awaited task: registration failed; the wait relies on the state checks", "task_id", id, "err", err)
	}
	recheck := time.NewTimer(awaitRecheck)
	defer recheck.Stop()
	var last Task
	for {
		t, err := a.store.Get(ctx, id)
		switch {
		case err != nil && ctx.Err() != nil:
			return last, ctx.Err()
		case err != nil:
			return t, err
		case t.Status.Terminal():
			return t, nil
		}
		last = t
		select {
		case <-ch:
		case <-recheck.C: // once
		case <-ctx.Done():
			return last, ctx.Err()
		}
	}
}

// registerSQL registers the tasks $1 as awaited for $2 ms from now (a
// registration already longer is kept), in the order of their ids (two
// Awaiters renewing the same tasks lock them in one order), and removes
// the registrations that have run out, other than those of $1.
const registerSQL = `
WITH gone AS (
    DELETE FROM ingest_task_awaited WHERE until < now() AND task_id <> ALL($1::uuid[])
)
INSERT INTO ingest_task_awaited (task_id, until)
SELECT DISTINCT id, now() + $2 * interval '1 millisecond' FROM unnest($1::uuid[]) AS x(id) ORDER BY id
ON CONFLICT (task_id) DO UPDATE SET until = greatest(ingest_task_awaited.until, excluded.until)`

// register registers ids as awaited for awaitHold state checks' intervals.
func (a *Awaiter) register(ctx context.Context, ids []uuid.UUID) error {
	hold := awaitHold * max(cmp.Or(a.Fallback, DefaultAwaitFallback), cmp.Or(a.Poll, DefaultAwaitPoll))
	_, err := a.store.db.Exec(ctx, registerSQL, ids, hold.Milliseconds())
	return err
}

// Close stops the Awaiter's connection and waits for it; a later Wait
// opens it again.
func (a *Awaiter) Close() {
	a.mu.Lock()
	stop, done := a.stop, a.done
	a.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func (a *Awaiter) add(id uuid.UUID, ch chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.waiters[id]
	if w == nil {
		w = map[chan struct{}]struct{}{}
		a.waiters[id] = w
	}
	w[ch] = struct{}{}
	if !a.running {
		a.running = true
		ctx, stop := context.WithCancel(context.Background())
		a.stop, a.done = stop, make(chan struct{})
		go a.run(ctx, a.done)
	}
}

func (a *Awaiter) remove(id uuid.UUID, ch chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.waiters[id], ch)
	if len(a.waiters[id]) == 0 {
		delete(a.waiters, id)
	}
}

// wake tells the waiters of ids (all when ids is nil) to read their task
// again.
func (a *Awaiter) wake(ids []uuid.UUID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	poke := func(w map[chan struct{}]struct{}) {
		for ch := range w {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	if ids == nil {
		for _, w := range a.waiters {
			poke(w)
		}
		return
	}
	for _, id := range ids {
		poke(a.waiters[id])
	}
}

// notified wakes the waiters of the ids of a DoneChannel payload.
func (a *Awaiter) notified(payload string) {
	var ids []uuid.UUID
	for s := range strings.SplitSeq(payload, ",") {
		if id, err := uuid.Parse(s); err == nil {
			ids = append(ids, id)
		}
	}
	if len(ids) > 0 {
		a.wake(ids)
	}
}

// run keeps the LISTEN connection and runs the state check until ctx is
// cancelled or nobody has waited for awaitIdle.
func (a *Awaiter) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	lctx, stopListen := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.listen(lctx) })
	defer func() {
		stopListen()
		wg.Wait()
	}()
	idleSince := time.Now()
	for {
		a.mu.Lock()
		interval := cmp.Or(a.Poll, DefaultAwaitPoll)
		if a.listening {
			interval = cmp.Or(a.Fallback, DefaultAwaitFallback)
		}
		ids := make([]uuid.UUID, 0, len(a.waiters))
		for id := range a.waiters {
			ids = append(ids, id)
		}
		if len(ids) > 0 {
			idleSince = time.Now()
		}
		if ctx.Err() != nil || (len(ids) == 0 && time.Since(idleSince) >= awaitIdle) {
			a.running = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		if len(ids) > 0 {
			if err := a.register(ctx, ids); err != nil && ctx.Err() == nil {
				a.log.Warn("awaited tasks: renewing their registration failed", "err", err)
			}
			if ended, err := a.ended(ctx, ids); err != nil {
				if ctx.Err() == nil {
					a.log.Warn("awaited tasks: state check failed", "err", err)
				}
			} else if len(ended) > 0 {
				a.wake(ended)
			}
		}
		pgsession.Sleep(ctx, min(interval, awaitIdle))
	}
}

// endedSQL returns the terminal tasks among $1.
var endedSQL = `SELECT id FROM ingest_task WHERE id = ANY($1::uuid[]) AND CASE WHEN status IN ` + terminalSQL + ` THEN true ELSE false END`

// ended returns the terminal tasks among ids.
func (a *Awaiter) ended(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error) {
	rows, err := a.store.db.Query(ctx, endedSQL, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
}

// listen LISTENs on DoneChannel until ctx is cancelled, re-opening a lost
// connection with backoff. Each time it starts listening it wakes every
// waiter, so a task that ended while nothing listened is read again.
func (a *Awaiter) listen(ctx context.Context) {
	redial := pgsession.Redial{Min: 100 * time.Millisecond, Max: awaitRetryMax}
	for {
		err := a.store.listen(ctx, DoneChannel, awaitApplicationName, func() {
			a.mu.Lock()
			a.listening = true
			a.mu.Unlock()
			redial.Connected()
			a.wake(nil)
		}, a.notified)
		a.mu.Lock()
		a.listening = false
		a.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrNoListen) {
			a.log.Info("task ends are not LISTENed for (no direct PostgreSQL session); waits poll every second")
			return
		}
		wait := redial.Pause()
		a.log.Warn("task-end LISTEN connection lost; waits poll until it is back", "err", err, "retry_in", wait)
		if !pgsession.Sleep(ctx, wait) {
			return
		}
	}
}
