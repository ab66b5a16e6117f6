package ingest

import (
	"context"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// timeoutOf returns the deadline of a run of t (0: none): the task's own
// timeout, else its kind's, else the worker's.
func (p *processor) timeoutOf(t *task.Task) time.Duration {
	if t.TimeoutMS > 0 {
		return time.Duration(t.TimeoutMS) * time.Millisecond
	}
	if d := p.handlers.optionsOf(t.Kind).Timeout; d > 0 {
		return d
	}
	return p.cfg.TaskTimeout
}

// abandonAfterTimeout stops renewing the lease of r, whose handler has
// not returned by its deadline plus one lease, so that the task can be
// taken over (see HandlerOptions). The handler's goroutine and slot stay
// until it returns.
func (p *processor) abandonAfterTimeout(r *run, timeout time.Duration) {
	if !p.inflight.abandoned(r) {
		return
	}
	p.log.Error("handler ignores its timeout: no longer renewing its task's lease, which another worker takes over once it expires",
		"task_id", r.task.ID, "kind", r.task.Kind, "attempt", r.task.Attempt, "timeout", timeout, "lease", p.cfg.TaskLease)
	p.abandons.Add(1)
	go func() {
		defer p.abandons.Done()
		p.abandon(r)
	}()
}

// abandon hands the entry of r, a run abandoned past its timeout, to the
// transport's abandon (Redis: to a consumer no worker reads as), so that
// other workers take the task over once its lease has expired rather than
// after the reclaim idle time: their reclaimers take over the entries of
// expired leases only from silent consumers, and this worker, which still
// reads, is not one. This worker does not take it over itself: a second
// run under its own lease could not be told apart from the stuck one. It
// holds settleMu, so it never overrides the settling of the run's outcome
// (a handler that returns meanwhile is settled as usual).
func (p *processor) abandon(r *run) {
	p.settleMu.Lock()
	defer p.settleMu.Unlock()
	if p.inflight.hasReturned(r) {
		return
	}
	ctx, cancel := context.WithTimeout(p.ioCtx, p.cfg.TaskLease/3)
	defer cancel()
	if err := p.tr.abandon(ctx, []string{r.d.id}); err != nil {
		p.log.Warn("hand over the entry of an abandoned run failed; the task is taken over after the reclaim idle time",
			"task_id", r.task.ID, "message_id", r.d.id, "err", err)
	}
}
