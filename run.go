package ingest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/task"
)

// dispatch runs the handler of a started task in its slot.
func (p *processor) dispatch(d delivery, t *task.Task) {
	tp := cmp.Or(t.Traceparent, d.traceparent)
	hctx, cancel := context.WithCancelCause(p.handlerCtx)
	r := &run{d: d, cancel: cancel, timeout: p.timeoutOf(t), sealed: t.PayloadError(), task: Task{
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
	p.inflight.add(r)
	p.work.Add(1)
	go func() {
		defer p.work.Done()
		p.execute(hctx, r)
	}()
}

// execute runs one handler and hands its outcome to the completer.
func (p *processor) execute(ctx context.Context, r *run) {
	timeout := r.timeout
	tctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, timeout)
		abandon := time.AfterFunc(timeout+p.cfg.TaskLease, func() { p.abandonAfterTimeout(r, timeout) })
		defer abandon.Stop()
	}
	var result json.RawMessage
	err := p.prepare(tctx, r)
	if err == nil {
		result, err = call(tctx, p.handlers.lookup(r.task.Kind), r.task)
	}
	timedOut := errors.Is(tctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
	cancel()
	if err == nil {
		result, err = p.store.CheckResult(result)
	}
	// The last progress of a successful run is written before its
	// success; a failed run's goes with its retry.
	r.task.progress.finish(err == nil)
	// What only the handler needed goes now: the run may wait in the
	// completer's queue (docs/ARCHITECTURE.md §1.4), holding only what
	// its completion and its message need.
	r.task.Payload, r.task.Dependencies, r.task.progress = nil, nil, nil
	o := outcome{r: r, err: err, result: result}
	if err != nil {
		switch {
		case errors.Is(context.Cause(ctx), errShutdown):
			o.released = true
		case timedOut:
			o.err = fmt.Errorf("task timeout after %s: %w", timeout, err)
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
	p.inflight.handedOver(r)
}

// prepare completes what a run's handler is given, or says why the
// handler must not be called: a payload this worker cannot open (a key it
// lacks) is a counted failed attempt, retried with backoff, so a worker
// given the key later runs it (once attempts are spent it is DEAD with
// this error, for a redrive: never lost); a task with dependencies gets
// their results in Task.Dependencies (a task without them costs nothing),
// and a failed read of them fails the run like a handler error.
func (p *processor) prepare(ctx context.Context, r *run) error {
	if r.sealed != nil {
		return r.sealed
	}
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
