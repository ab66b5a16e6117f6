package ingest

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// settler is where the completer hands recorded outcomes: the processor's
// settling of messages and its DLQ writes (settle.go).
type settler interface {
	settle(acks []string, later []deferral, ds []delivery, metric map[string]string)
	deadLetter(letters []letter)
}

// completer records handler outcomes in Postgres, then hands their
// messages to the settler (the commit comes before any ack) and frees the
// kind slots of finished tasks. It owns the outcome queue, the batching
// and the flushers. Handlers hand it their outcomes and return their
// handler slots; their runs stay in flight (their leases renewed, their
// messages not re-read) until it has settled them.
type completer struct {
	store     *task.Store
	settler   settler
	admission *admission
	log       *slog.Logger
	owner     string // the worker's consumer name, the lease owner
	// max, window and parallel are Config.CompleteBatch, CompleteWindow
	// and CompleteParallel.
	max, parallel int
	window        time.Duration
	// ioCtx carries the store calls; cancelled last at shutdown.
	ioCtx context.Context
	// in carries outcomes from handlers; its capacity is outcomeQueue. A
	// handler's slot is free again once its outcome is in the queue, so
	// the queue, not the slots, bounds the outcomes waiting to be
	// recorded: when it is full, handlers wait to hand theirs over.
	in chan outcome
	// onSucceeded is the benchmark hook of internal/hook (nil: none); set
	// by start.
	onSucceeded func([]uuid.UUID)
	// beforeRecord, when set (by this package's tests, before start), runs
	// before each store call that records outcomes, with its op.
	beforeRecord func(op string)
	stop, done   chan struct{}
}

// newCompleter returns the completer of a worker configured by cfg.
func newCompleter(ioCtx context.Context, cfg Config, store *task.Store, s settler, adm *admission, log *slog.Logger) *completer {
	return &completer{
		store: store, settler: s, admission: adm, log: log, owner: cfg.Consumer,
		max: cfg.CompleteBatch, parallel: cfg.CompleteParallel, window: cfg.CompleteWindow,
		ioCtx: ioCtx, in: make(chan outcome, outcomeQueue(cfg)),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// outcomeQueue is the capacity of the completer's queue of outcomes for
// cfg: a batch for each flusher, so the next batches are gathered while
// every flusher commits, and never fewer than the handler slots, so that
// the handlers cut off at once by shutdown all hand theirs over without
// waiting. With the defaults (64 × 4) a worker holds at most 256 queued,
// 64 being gathered and 4 × 64 being recorded: 576 outcomes, each
// a run whose lease the heartbeat renews, beside its 16 running handlers.
func outcomeQueue(cfg Config) int {
	return max(cfg.Concurrency, cfg.CompleteBatch*cfg.CompleteParallel)
}

// start runs the completer on its own goroutine until stopWithin.
// onSucceeded is the benchmark hook (nil: none).
func (c *completer) start(onSucceeded func([]uuid.UUID)) {
	c.onSucceeded = onSucceeded
	go func() {
		defer close(c.done)
		c.run(c.stop)
	}()
}

// add hands the completer the outcome of a run, waiting while its queue
// is full. It reports false when the completer has stopped (a handler that
// returned after the end of shutdown): the outcome is not recorded.
func (c *completer) add(o outcome) bool {
	select {
	case c.in <- o:
		return true
	case <-c.done:
		return false
	}
}

// stopWithin tells the completer to record what is queued and stop, and
// reports whether it stopped within d (else see wait).
func (c *completer) stopWithin(d time.Duration) bool {
	close(c.stop)
	return waitFor(c.done, d)
}

// wait waits until the completer has stopped.
func (c *completer) wait() { <-c.done }

// run records handler outcomes in batches: it gathers outcomes for at most
// Config.CompleteWindow or Config.CompleteBatch of them, and hands each
// batch to one of Config.CompleteParallel flushers, which make one store
// call per kind of outcome (succeed, fail, release) and then acknowledge,
// set idle times and dead-letter in Redis. While a flusher waits for its
// commit, the next batch is gathered and flushed. It returns when stop is
// closed, after recording what is queued.
func (c *completer) run(stop <-chan struct{}) {
	max, window := c.max, c.window
	flush := make(chan []outcome)
	var flushers sync.WaitGroup
	for range c.parallel {
		flushers.Add(1)
		go func() {
			defer flushers.Done()
			for batch := range flush {
				c.complete(batch)
			}
		}()
	}
	defer func() {
		close(flush)
		flushers.Wait()
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case o := <-c.in:
			batch := make([]outcome, 1, max)
			batch[0] = o
			timer.Reset(window)
		gather:
			for len(batch) < max {
				select {
				case o := <-c.in:
					batch = append(batch, o)
				case <-timer.C:
					break gather
				}
			}
			timer.Stop()
			flush <- batch
		case <-stop:
			for {
				batch := make([]outcome, 0, max)
			drain:
				for len(batch) < max {
					select {
					case o := <-c.in:
						batch = append(batch, o)
					default:
						break drain
					}
				}
				if len(batch) == 0 {
					return
				}
				flush <- batch
			}
		}
	}
}

// complete records one batch of outcomes.
func (c *completer) complete(batch []outcome) {
	var rel, unrun []uuid.UUID
	succ := make([]task.Success, 0, len(batch))
	var fails []task.Failure
	byTask := make(map[uuid.UUID]outcome, len(batch))
	for _, o := range batch {
		id := o.r.task.ID
		byTask[id] = o
		switch {
		case o.unrun:
			unrun = append(unrun, id)
		case o.released:
			rel = append(rel, id)
		case o.err == nil:
			succ = append(succ, task.Success{ID: id, Result: o.result})
		default:
			f := task.Failure{ID: id, Error: o.err.Error(), Permanent: IsPermanent(o.err)}
			f.RetryAfter, _ = RetryDelay(o.err)
			fails = append(fails, f)
		}
	}
	me := c.owner
	var results []task.Result
	results = append(results, c.storeCall("succeed", len(succ), func(ctx context.Context) ([]task.Result, error) {
		return c.store.SucceedWith(ctx, me, succ...)
	})...)
	if hook := c.onSucceeded; hook != nil && len(results) > 0 {
		done := make([]uuid.UUID, 0, len(results))
		for _, r := range results {
			if r.Applied {
				done = append(done, r.ID)
			}
		}
		hook(done)
	}
	results = append(results, c.storeCall("fail", len(fails), func(ctx context.Context) ([]task.Result, error) {
		return c.store.Fail(ctx, me, fails...)
	})...)
	nRel := len(results)
	results = append(results, c.storeCall("release", len(rel), func(ctx context.Context) ([]task.Result, error) {
		return c.store.Release(ctx, me, rel...)
	})...)
	results = append(results, c.storeCall("release", len(unrun), func(ctx context.Context) ([]task.Result, error) {
		return c.store.ReleaseUnrun(ctx, me, unrun...)
	})...)

	now := time.Now()
	// Sized for the batch: most outcomes are acknowledged and settled.
	acks := make([]string, 0, len(batch))
	var later []deferral
	var letters []letter
	settle := make([]delivery, 0, len(batch))
	metric := make(map[string]string, len(batch))
	recorded := make(map[uuid.UUID]bool, len(batch))
	for i, res := range results {
		o, ok := byTask[res.ID]
		if !ok {
			continue
		}
		recorded[res.ID] = true
		d := o.r.d
		released := i >= nRel
		switch {
		case !res.Applied:
			c.conflict(o, res)
			metric[d.id] = resultConflict
		case res.Status == task.Cancelled:
			// Whatever the handler returned: the cancel request committed
			// first. Terminal, no DLQ entry.
			c.log.Info("task cancelled", "task_id", res.ID, "message_id", d.id, "attempt", o.r.task.Attempt, "err", o.err)
			acks = append(acks, d.id)
			metric[d.id] = resultCancelled
		case released:
			if o.unrun {
				c.log.Warn("task released unrun: its lease could not be confirmed after a wait for a handler slot; it runs again", "task_id", res.ID, "message_id", d.id, o.r.traceAttr())
			} else {
				c.log.Info("task released at shutdown; another worker runs it", "task_id", res.ID, "message_id", d.id, o.r.traceAttr())
			}
			later = append(later, deferral{id: d.id, taskID: res.ID, at: now})
			metric[d.id] = resultReleased
		case res.Status == task.Succeeded:
			acks = append(acks, d.id)
			metric[d.id] = resultSucceeded
		case res.Status == task.Retrying:
			c.log.Info("task failed; retrying", "task_id", res.ID, "message_id", d.id,
				"attempt", o.r.task.Attempt, "next_retry_at", res.NextRetryAt, "err", o.err, o.r.traceAttr())
			later = append(later, deferral{id: d.id, taskID: res.ID, at: timeOr(res.NextRetryAt, now)})
			metric[d.id] = resultRetry
		case res.Status == task.Dead:
			c.log.Warn("task failed: DEAD", "task_id", res.ID, "message_id", d.id,
				"attempt", o.r.task.Attempt, "permanent", IsPermanent(o.err), "err", o.err, o.r.traceAttr())
			metric[d.id] = resultDead // for the attempt span; not settled here
			t := &task.Task{ID: res.ID, Kind: o.r.task.Kind, AttemptCount: res.AttemptCount, LastError: res.LastError, FinishedAt: res.FinishedAt}
			letters = append(letters, taskLetter(d, t, resultDead, now))
			continue
		}
		settle = append(settle, d)
	}
	// Outcomes a failed store call could not record (the worker stopped
	// while Postgres was unreachable): their entries stay pending and their
	// leases expire; a takeover counts the run as failed.
	for id, o := range byTask {
		if !recorded[id] {
			settle = append(settle, o.r.d)
			metric[o.r.d.id] = resultConflict
		}
	}
	for _, o := range byTask {
		o.r.endAttempt(metric[o.r.d.id], o.err, o.timedOut)
	}
	c.settler.settle(acks, later, settle, metric)
	c.settler.deadLetter(letters)
	done := map[string][]uuid.UUID{}
	for _, res := range results {
		if o, ok := byTask[res.ID]; ok && res.Applied {
			done[o.r.task.Kind] = append(done[o.r.task.Kind], res.ID)
		}
	}
	// Off the completer's path: the next outcomes need not wait (shutdown
	// waits for it).
	c.admission.freeKindSlots(c.ioCtx, done)
}

// conflict reports a completion whose guard matched nothing: the lease was
// lost (taken over after it expired). Nothing changed; the entry is left to
// whoever holds the task now.
func (c *completer) conflict(o outcome, res task.Result) {
	c.log.Warn("task outcome not recorded: lease lost", "task_id", res.ID, "message_id", o.r.d.id,
		"attempt", o.r.task.Attempt, "status", res.Status, "lease_owner", res.LeaseOwner,
		"attempt_count", res.AttemptCount, "err", o.err, o.r.traceAttr())
}

// storeCall runs a store call of n tasks, retrying with backoff while it
// fails, until the worker's I/O is cancelled (then it returns nil).
func (c *completer) storeCall(op string, n int, f func(context.Context) ([]task.Result, error)) []task.Result {
	if n == 0 {
		return nil
	}
	if c.beforeRecord != nil {
		c.beforeRecord(op)
	}
	delay := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		res, err := f(c.ioCtx)
		if err == nil {
			return res
		}
		if c.ioCtx.Err() != nil {
			c.log.Error("recording outcomes failed at shutdown; their entries stay pending", "op", op, "count", n, "err", err)
			return nil
		}
		if attempt == 1 {
			c.log.Error("recording outcomes failed; retrying", "op", op, "count", n, "err", err)
		}
		t := time.NewTimer(delay)
		select {
		case <-c.ioCtx.Done():
		case <-t.C:
		}
		t.Stop()
		delay = min(2*delay, 5*time.Second)
	}
}
