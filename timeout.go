package ingest

import (
	"fmt"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// HandlerOptions are the per-kind settings of a handler (see
// Worker.HandleWith).
//
// Timeouts. A run's deadline is the task's own timeout (timeout_ms, set at
// creation), else its kind's Timeout, else the worker's Config.TaskTimeout
// (INGEST_TASK_TIMEOUT_MS); 0 at every level: none. When it passes, the
// handler's context is cancelled; the run is a failed attempt whose
// last_error starts "task timeout after", and it is retried or goes DEAD
// like any other failure.
//
// A handler that ignores its context keeps its slot until it returns, but
// not its task: once the deadline plus one lease (Config.TaskLease) has
// passed without the handler returning, the heartbeat stops renewing the
// task's lease and its entry's idle time, so after the lease expires the
// task is taken over by a worker (a failed attempt, like a crash). Whatever
// the stuck handler returns later is refused by the lease guard.
type HandlerOptions struct {
	// Timeout is the default deadline of the kind's runs; 0: the worker's.
	Timeout time.Duration
}

// Validate names a bad option.
func (o HandlerOptions) Validate() error {
	if o.Timeout < 0 {
		return fmt.Errorf("invalid Timeout: must be >= 0 (0: the worker's), got %s", o.Timeout)
	}
	return nil
}

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
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.returned || r.lost {
		return
	}
	r.lost = true
	p.log.Error("handler ignores its timeout: no longer renewing its task's lease, which another worker takes over once it expires",
		"task_id", r.task.ID, "kind", r.task.Kind, "attempt", r.task.Attempt, "timeout", timeout, "lease", p.cfg.TaskLease)
}
