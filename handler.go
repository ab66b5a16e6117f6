package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Task is what a Handler is given: one run (attempt) of one task.
type Task struct {
	// ID identifies the task; use it as the idempotency key of the side
	// effects the handler causes (a run may be repeated, see Handler).
	ID uuid.UUID
	// Kind selected this handler.
	Kind string
	// Payload is the task's JSON payload as stored in Postgres.
	Payload json.RawMessage
	// Attempt is this run's number: 1 for the first run, and one more for
	// each failed run before it.
	Attempt int
	// MaxAttempts is how many runs the task gets before it goes DEAD.
	MaxAttempts int
}

// Handler runs tasks of one kind.
//
// The contract: delivery is at-least-once. A handler may run more than once
// for one task (a worker crashed after the side effect but before recording
// success, or lost its lease), so its side effects must be idempotent; use
// Task.ID as the idempotency key. The worker, not the handler, acknowledges
// the stream entry, and only after the outcome is committed in Postgres:
//
//   - return nil: the task is SUCCEEDED and its entry acked;
//   - return an error: the task is RETRYING after the backoff, or DEAD once
//     attempts are exhausted (then its entry moves to the DLQ);
//   - return Permanent(err): DEAD at once, no retry;
//   - return RetryAfter(d, err): RETRYING, due after d instead of the backoff;
//   - panic: treated as an error carrying the panic value and a short stack.
//
// ctx is cancelled when the task's timeout passes, the worker shuts down
// past its grace period, or an operator cancels the task; a handler must
// return promptly then. A run cut off by shutdown is handed back (not
// counted as a failure) and runs again on another worker. A cancelled
// task's context has the cause ErrCancelled (errors.Is(context.Cause(ctx),
// ErrCancelled)); the task ends CANCELLED whatever the handler returns.
type Handler func(ctx context.Context, t Task) error

// ErrCancelled is the cause (context.Cause) of a handler's context that
// was cancelled because an operator cancelled the task (task.Store.Cancel,
// POST /v1/tasks/{id}/cancel, ingest-worker task cancel).
var ErrCancelled = errors.New("task cancelled")

// permanentError marks an error that must not be retried.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as a failure that retrying cannot fix: the task goes
// DEAD after this run. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err (or an error it wraps) was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// retryAfterError asks for the next run after a given delay.
type retryAfterError struct {
	delay time.Duration
	err   error
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.err, e.delay)
}
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter marks err as a failure whose next run is due after d instead of
// the backoff delay (for example from an HTTP Retry-After header). It still
// counts as a failed attempt. RetryAfter(d, nil) is nil.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{delay: d, err: err}
}

// RetryDelay returns the delay requested with RetryAfter, if any.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) && r.delay > 0 {
		return r.delay, true
	}
	return 0, false
}
