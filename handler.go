package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// Task is what a Handler is given: one run (attempt) of one task.
type Task struct {
	// ID identifies the task; use it as the idempotency key of the side
	// effects the handler causes (a run may be repeated, see Handler).
	ID uuid.UUID
	// Kind selected this handler.
	Kind string
	// Payload is the task's JSON payload as stored in Postgres; one
	// stored encrypted (task.Config.Keyring) is decrypted first, to the
	// canonical form it was created in. A task whose payload this worker
	// cannot decrypt never reaches a handler: its run fails naming the
	// key id.
	Payload json.RawMessage
	// Attempt is this run's number: 1 for the first run, and one more for
	// each failed run before it.
	Attempt int
	// MaxAttempts is how many runs the task gets before it goes DEAD.
	MaxAttempts int
	// GroupKey is the task's group (a tenant) as created; "" when none.
	GroupKey string
	// Dependencies holds the results of the task's dependencies
	// (NewTask.DependsOn), keyed by their ids: JSON null for one that
	// returned none, or ended DEAD or CANCELLED (a task created with
	// OnDependencyFailure "run"), or was deleted. Nil for a task without
	// dependencies: they are read when a run starts, and only then.
	Dependencies map[uuid.UUID]json.RawMessage

	// hasDependencies: the run reads Dependencies before the handler.
	hasDependencies bool

	// progress writes this run's progress (nil outside a worker's run).
	progress *progressReporter
	// ctx is this run's context (see Context; nil outside a worker's run).
	ctx context.Context
}

// ReportProgress reports how far this run has come: percent (0 to 100)
// and a short message (at most task.MaxProgressMessageBytes of UTF-8; ""
// for none), shown by GET /v1/tasks/{id}, task show and the dashboard.
// It returns at once: the worker writes a task's progress at most once a
// second, the latest report of each second winning, and the last report
// of a successful run before its success is recorded. A report of a run
// that lost its lease or was taken over changes nothing. The error names
// a bad argument ("percent", "message"); write failures are only logged.
// A retry clears the progress; a task's next run starts without one.
func (t Task) ReportProgress(percent int, message string) error {
	r := task.ProgressReport{ID: t.ID, Attempt: max(t.Attempt, 1), Percent: percent, Message: message}
	if ferr := r.Check(); ferr != nil {
		return ferr
	}
	if t.progress != nil {
		t.progress.report(r)
	}
	return nil
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

// ResultHandler is a Handler that also returns a result on success: JSON
// of at most INGEST_RESULT_MAX_BYTES (task.Config.MaxResultBytes, 1 MiB
// by default), stored with the task by the statement that records the
// success and shown by GET /v1/tasks/{id}. nil or JSON null is no result;
// a result that is not valid JSON or is too large fails the run (an
// ordinary failed attempt, retried) with an error saying so. The result
// of a run that returns an error is ignored. Everything else is Handler's
// contract. Returning adapts a function that returns any value.
type ResultHandler func(ctx context.Context, t Task) (json.RawMessage, error)

// handlerFunc is a registered handler as the worker calls it: a Handler
// is called as it is, not through an adapter to a ResultHandler, so the
// goroutine of a waiting handler holds no adapter's frame (see
// processor.execute). One of plain and result is set, or neither (none).
type handlerFunc struct {
	plain  Handler
	result ResultHandler
}

// fn is h as a registered handler.
func (h Handler) fn() handlerFunc { return handlerFunc{plain: h} }

// fn is h as a registered handler.
func (h ResultHandler) fn() handlerFunc { return handlerFunc{result: h} }

// isNil reports whether f is no handler.
func (f handlerFunc) isNil() bool { return f.plain == nil && f.result == nil }

// Returning adapts f, which returns any value, to a ResultHandler that
// marshals its value as JSON on success (a marshalling error fails the
// run).
func Returning[T any](f func(ctx context.Context, t Task) (T, error)) ResultHandler {
	return func(ctx context.Context, t Task) (json.RawMessage, error) {
		v, err := f(ctx, t)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("result: %w", err)
		}
		return b, nil
	}
}

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

// HandlerOptions are the per-kind settings of a handler (see
// Service.HandleWith).
//
// Timeouts. A run's deadline is the task's own timeout (timeout_ms, set at
// creation), else its kind's Timeout, else the service's Config.TaskTimeout
// (INGEST_TASK_TIMEOUT_MS); 0 at every level: none. When it passes, the
// handler's context is cancelled; the run is a failed attempt whose
// last_error starts "task timeout after", and it is retried or goes DEAD
// like any other failure.
//
// A handler that ignores its context keeps its slot until it returns, but
// not its task: once the deadline plus one lease (Config.TaskLease) has
// passed without the handler returning, the heartbeat stops renewing the
// task's lease and its entry's idle time, and the entry is handed to the
// worker's abandoned consumer (stream.AbandonedConsumer), so after the
// lease expires another worker's reclaimer takes the task over (a failed
// attempt, like a crash; package reclaim). Whatever the stuck handler
// returns later is refused by the lease guard. In Kafka mode the record
// stays with this worker, so the task waits for the handler to return.
type HandlerOptions struct {
	// Timeout is the default deadline of the kind's runs; 0: the worker's.
	Timeout time.Duration
}

// Validate names a bad option.
func (o HandlerOptions) Validate() error {
	if o.Timeout < 0 {
		return configError("HandlerOptions.Timeout", "must be >= 0 (0: the worker's), got %s", o.Timeout)
	}
	return nil
}

// registry maps task kinds to handlers and their options; handlers may be
// registered while the worker runs.
type registry struct {
	mu       sync.RWMutex
	byKind   map[string]handlerFunc
	fallback handlerFunc // for kinds without a handler; zero: none
	options  map[string]HandlerOptions
}

func newRegistry() *registry {
	return &registry{byKind: map[string]handlerFunc{}, options: map[string]HandlerOptions{}}
}

// handle registers h for kind with opts. It panics on an empty kind, a nil
// handler or invalid options.
func (r *registry) handle(kind string, h handlerFunc, opts HandlerOptions) {
	if kind == "" || h.isNil() {
		panic("ingest: Handle needs a kind and a handler")
	}
	if err := opts.Validate(); err != nil {
		panic("ingest: HandleWith(" + strconv.Quote(kind) + "): " + err.Error())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byKind[kind] = h
	r.options[kind] = opts
}

// handleDefault registers h for every kind without a handler of its own.
// It panics on a nil handler.
func (r *registry) handleDefault(h handlerFunc) {
	if h.isNil() {
		panic("ingest: HandleDefault needs a handler")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fallback = h
}

// optionsOf returns the options of kind (zero when none were set).
func (r *registry) optionsOf(kind string) HandlerOptions {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.options[kind]
}

// lookup returns the handler of kind, the fallback, or none.
func (r *registry) lookup(kind string) handlerFunc {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if h, ok := r.byKind[kind]; ok {
		return h
	}
	return r.fallback
}

// shortStack returns up to 8 frames of the panicking goroutine, below the
// runtime's panic machinery.
func shortStack() string {
	pcs := make([]uintptr, 32)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var b strings.Builder
	count := 0
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			fmt.Fprintf(&b, "%s\n\t%s:%d\n", f.Function, f.File, f.Line)
			count++
		}
		if !more || count == 8 || strings.HasSuffix(f.Function, "ingest.(*processor).execute") {
			break
		}
	}
	return strings.TrimRight(b.String(), "\n")
}
