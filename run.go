package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/task"
)

// dispatch runs the handler of a started task in a handler slot: the one
// its message holds (in held, which it leaves), or the next free one
// (inflight.toRun). leased is a time before the start that took the
// task's lease.
func (p *processor) dispatch(d delivery, t *task.Task, held map[string]bool, leased time.Time) {
	tp := cmp.Or(t.Traceparent, d.traceparent)
	hctx, cancel := context.WithCancelCause(p.handlerCtx)
	r := &run{d: d, cancel: cancel, timeout: p.timeoutOf(t), err: t.PayloadError(), handler: p.handlers.lookup(t.Kind), task: Task{
		ID:          t.ID,
		Kind:        t.Kind,
		Payload:     t.Payload,
		Attempt:     t.AttemptCount + 1,
		MaxAttempts: t.EffectiveMaxAttempts(p.store.Config().MaxAttempts),
		GroupKey:    t.GroupKey,

		hasDependencies: t.DependencyDepth > 0,
	}}
	r.task.progress = newProgressReporter(p.ioCtx, p.store, p.log, p.cfg.Consumer)
	hctx, r.span = startAttempt(hctx, r.task, tp)
	if r.span != nil {
		r.traceID = tracing.TraceID(hctx)
	}
	r.task.ctx = hctx
	r.leased = leased
	if held[d.id] {
		delete(held, d.id)
		r.slot = true
	}
	p.inflight.add(r)
	p.work.Add(1)
	if r.slot || p.inflight.toRun(r) {
		go p.execute(r)
	}
}

// execute is the goroutine of run r: it calls the handler, and finish
// hands the outcome to the completer. A handler that waits has only
// execute's frame below its own on the goroutine's stack, so execute does
// nothing but the call: what comes before it (begin) and after it
// (finish, deferred, which also recovers a panic) runs in functions whose
// frames are not on the stack while the handler runs. A goroutine whose
// frames fit in the runtime's smallest stack (2 KiB) then holds that much
// for a waiting handler, not twice that (docs/PERFORMANCE.md, memory at
// 10,000 in flight).
func (p *processor) execute(r *run) {
	defer p.finish(r)
	if !p.begin(r) {
		return
	}
	if h := r.handler.plain; h != nil {
		r.err = h(r.task.ctx, r.task)
	} else {
		r.result, r.err = r.handler.result(r.task.ctx, r.task)
	}
	r.called = true
}

// begin makes r's handler context (with r's deadline, when it has one)
// and prepares the run (see prepare): it reports false, r.err set, when
// the handler must not be called.
//
//go:noinline
func (p *processor) begin(r *run) bool {
	if r.err != nil {
		return false // sealed
	}
	if r.task.ctx.Err() != nil || (p.inflight.stale(r) && !p.confirmLease(r)) {
		// Cut off before its handler was called (shutdown, a cancel, a
		// lost lease, a lease that could not be confirmed).
		r.err = context.Cause(r.task.ctx)
		return false
	}
	r.began = time.Now()
	if r.handler.isNil() {
		r.err = fmt.Errorf("no handler registered for task kind %q", r.task.Kind)
		return false
	}
	if timeout := r.timeout; timeout > 0 {
		ctx, cancel := context.WithTimeout(r.task.ctx, timeout)
		abandon := time.AfterFunc(timeout+p.cfg.TaskLease, func() { p.abandonAfterTimeout(r, timeout) })
		r.deadline = &deadline{parent: r.task.ctx, cancel: cancel, abandon: abandon}
		r.task.ctx = ctx
	}
	r.err = p.prepare(r.task.ctx, r)
	return r.err == nil
}

// confirmLease renews the lease of r before its handler is called, its
// lease last known renewed over staleAfter ago (it waited for a handler
// slot while the heartbeat was late or failing, so the lease may have
// lapsed and another worker taken the task): one guarded statement, the
// heartbeat's renewal for this task alone. It reports whether r may run;
// when not, r's context is cancelled with why: its lease lost (taken
// over, or the task finished elsewhere: nothing of it is recorded here),
// an operator's cancel, or a renewal that failed (errLeaseStale: the task
// is released unrun and runs again).
func (p *processor) confirmLease(r *run) bool {
	// No deadline of its own: a slow answer (a busy database, a pool
	// whose connections are all taken) is still an answer, its guard
	// decides whatever the wait, and nothing else could start meanwhile
	// on a database that does not answer. Shutdown's cut-off ends it.
	at := time.Now()
	renewed, cancelled, err := p.store.Renew(r.task.ctx, p.cfg.Consumer, p.cfg.TaskLease, r.task.ID)
	switch {
	case r.task.ctx.Err() != nil:
		// Cut off meanwhile (shutdown, a cancel): its cause stands.
	case err != nil:
		p.log.Warn("confirming the lease of a task that waited for a handler slot failed; releasing it unrun",
			"task_id", r.task.ID, "message_id", r.d.id, "err", err, r.traceAttr())
		r.cancel(errLeaseStale)
	case len(renewed) == 0:
		p.inflight.leaseConfirmed(r, false, at)
		p.log.Warn("task lease lost while it waited for a handler slot; not running it", "task_id", r.task.ID, "message_id", r.d.id, "attempt", r.task.Attempt, r.traceAttr())
		r.cancel(errLeaseLost)
	case len(cancelled) > 0:
		p.heartbeater.cancelRun(r.task.ID, "lease confirmation")
	default:
		p.inflight.leaseConfirmed(r, true, at)
		return true
	}
	return false
}

// deadline is what a run with a deadline holds beside its context.
type deadline struct {
	// parent is the run's context without the deadline.
	parent context.Context
	cancel context.CancelFunc
	// abandon fires once the handler outruns its deadline by a lease
	// (abandonAfterTimeout).
	abandon *time.Timer
}

// finish is deferred by execute: it takes the outcome of r's handler (a
// panic, recovered here, is an error carrying the panic value and a short
// stack) and hands it to the completer.
func (p *processor) finish(r *run) {
	defer p.work.Done()
	if v := recover(); v != nil {
		r.result, r.err = nil, fmt.Errorf("panic: %v\n%s", v, shortStack())
	} else if !r.called && r.err == nil {
		// The handler ended its goroutine (runtime.Goexit).
		r.err = errors.New("handler exited its goroutine (runtime.Goexit) without returning")
	}
	ctx, timedOut := r.task.ctx, false
	if d := r.deadline; d != nil {
		timedOut = errors.Is(ctx.Err(), context.DeadlineExceeded) && d.parent.Err() == nil
		ctx = d.parent
		d.cancel()
		d.abandon.Stop()
	}
	p.handOver(r, ctx, timedOut)
}

// handOver hands the outcome of r's handler to the completer; ctx is the
// run's context (without its deadline) and timedOut whether the deadline
// cut the handler off.
//
//go:noinline
func (p *processor) handOver(r *run, ctx context.Context, timedOut bool) {
	err, result := r.err, r.result
	r.err, r.result = nil, nil
	if err == nil {
		result, err = p.store.CheckResult(result)
	}
	// The last progress of a successful run is written before its
	// success; a failed run's goes with its retry.
	r.task.progress.finish(err == nil)
	// What only the handler needed goes now: the run may wait in the
	// completer's queue (docs/ARCHITECTURE.md §1.4), holding only what
	// its completion and its message need.
	r.task.Payload, r.task.Dependencies, r.task.progress, r.task.ctx = nil, nil, nil, nil
	r.deadline = nil
	o := outcome{r: r, err: err, result: result}
	if err != nil {
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, errShutdown):
			o.released = true
		case errors.Is(cause, errLeaseStale):
			o.released, o.unrun = true, true
		case timedOut:
			o.err = fmt.Errorf("task timeout after %s: %w", r.timeout, err)
			o.timedOut = true
		}
	}
	p.inflight.returned(r)
	r.cancel(nil)
	// The slot comes back once the completer has taken the outcome (it
	// waits while the completer's queue is full): the next task may start
	// while this one's completion is still being recorded. The run stays in
	// flight, its lease renewed, until its message is settled.
	if !p.completer.add(o) {
		p.log.Error("worker stopped before the outcome could be recorded; the task is recovered when its lease expires",
			"task_id", r.task.ID, "message_id", r.d.id, "attempt", r.task.Attempt, r.traceAttr())
		r.endAttempt(resultConflict, o.err, o.timedOut)
	}
	var took time.Duration
	if r.called {
		took = max(time.Since(r.began), 1)
	}
	p.inflight.handedOver(r, took)
}

// prepare completes what a run's handler is given: a task with
// dependencies gets their results in Task.Dependencies (a task without
// them costs nothing), and a failed read of them fails the run like a
// handler error.
func (p *processor) prepare(ctx context.Context, r *run) error {
	if !r.task.hasDependencies {
		return nil
	}
	deps, err := p.store.DependencyResults(ctx, r.task.ID)
	if err != nil {
		return fmt.Errorf("read the results of the dependencies: %w", err)
	}
	r.task.Dependencies = deps
	return nil
}
