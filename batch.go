package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingest-worker/ingest/internal/tracing"
)

// Limits of BatchOptions.
const (
	// MaxBatchSize bounds BatchOptions.Max.
	MaxBatchSize = 1000
	// MaxBatchWait bounds BatchOptions.Wait.
	MaxBatchWait = time.Minute
)

// BatchOptions are the settings of a batch handler (Service.HandleBatch).
type BatchOptions struct {
	// Max is the most tasks one call of the handler gets, 1..MaxBatchSize.
	// A batch is also bounded by the worker's free handler slots (each
	// task of a batch holds one; Config.Concurrency): keep Concurrency at
	// least Max, or batches never fill and every one waits out Wait.
	Max int
	// Wait is how long a batch waits to fill after its first task arrives,
	// 0..MaxBatchWait; it is handed to the handler once it holds Max tasks
	// or Wait has passed, whichever comes first. 0: no waiting, a batch is
	// handed over at once with the tasks that joined it meanwhile (at
	// most those started by the same read; often just one).
	Wait time.Duration
	// Timeout is the default deadline of the kind's runs, as
	// HandlerOptions.Timeout (0: the worker's); a task's deadline counts
	// from its start, its wait for the batch included.
	Timeout time.Duration
}

// Validate names a bad option.
func (o BatchOptions) Validate() error {
	switch {
	case o.Max < 1 || o.Max > MaxBatchSize:
		return configError("BatchOptions.Max", "must be 1..%d, got %d", MaxBatchSize, o.Max)
	case o.Wait < 0 || o.Wait > MaxBatchWait:
		return configError("BatchOptions.Wait", "must be 0s..%s, got %s", MaxBatchWait, o.Wait)
	case o.Timeout < 0:
		return configError("BatchOptions.Timeout", "must be >= 0 (0: the worker's), got %s", o.Timeout)
	}
	return nil
}

// Outcome is a batch handler's verdict on one task of its batch (see
// BatchHandler); Task.Outcome builds one.
type Outcome struct {
	// TaskID names the task (Task.ID).
	TaskID uuid.UUID
	// Err is nil for a success; otherwise the run failed, exactly as if a
	// Handler had returned Err: retried after the backoff (RetryAfter: after
	// its delay), or DEAD once attempts are exhausted or at once when it is
	// Permanent.
	Err error
	// Result is a success's result (see ResultHandler): a json.RawMessage
	// is taken as it is, any other value is marshalled as JSON; nil: none.
	// Ignored when Err is set.
	Result any
}

// Outcome returns the outcome of t: a success with result when err is
// nil, else a failure with err (result ignored).
func (t Task) Outcome(result any, err error) Outcome {
	if err != nil {
		return Outcome{TaskID: t.ID, Err: err}
	}
	return Outcome{TaskID: t.ID, Result: result}
}

// Context returns the context of this task's run: cancelled when its
// timeout passes, an operator cancels the task (cause ErrCancelled), its
// lease is lost, or the worker shuts down past its grace period. A Handler
// gets the same context as its ctx; a BatchHandler, whose ctx serves the
// whole batch, reads each task's from here. Outside a worker's run it is
// context.Background().
func (t Task) Context() context.Context {
	if t.ctx == nil {
		return context.Background()
	}
	return t.ctx
}

// BatchHandler runs tasks of one kind in batches: it gets up to
// BatchOptions.Max started tasks (never two runs of one task, never two
// kinds) and returns an outcome per task, in any order, keyed by
// Outcome.TaskID.
//
// Each task of a batch is handled exactly as if it ran alone under a
// Handler (see Handler for the contract): it has its own start, attempt
// count, lease (renewed while the batch waits and runs), deadline, audit
// rows, retry or DLQ path, and it is recorded by the same guarded
// statements, so a run that lost its lease or was cancelled meanwhile
// changes nothing. Its outcome is:
//
//   - its Outcome (Err nil: SUCCEEDED with Result; else a failed run);
//   - a failed run, when the handler returns no outcome for it ("batch
//     handler returned no outcome for task …") or two;
//   - a failed run with err, for every task of the batch, when the handler
//     returns a non-nil error (Permanent(err): every task DEAD), whatever
//     outcomes it returned;
//   - a failed run carrying the panic value, for every task, when the
//     handler panics.
//
// ctx is cancelled once every task's own context (Task.Context) has
// ended: at shutdown past the grace period, or when all of the batch's
// deadlines have passed. A handler that can drop a single task early
// watches that task's Context: a task an operator cancelled ends
// CANCELLED whatever its outcome, and one cut off by shutdown is handed
// back, not counted as a failure.
type BatchHandler func(ctx context.Context, tasks []Task) ([]Outcome, error)

// HandleBatch registers fn for tasks of kind, replacing an earlier
// handler of the kind: the worker hands it the kind's tasks in batches of
// up to opts.Max (see BatchOptions and BatchHandler). Every task of a
// batch holds one handler slot from its start until its outcome is taken,
// so Config.Concurrency still bounds the tasks in flight. The error names
// a bad argument.
func (s *Service) HandleBatch(kind string, fn BatchHandler, opts BatchOptions) error {
	if kind == "" {
		return errors.New("ingest: HandleBatch: empty kind (HandleDefaultBatch serves every kind)")
	}
	return s.worker.handleBatch(kind, fn, opts)
}

// HandleDefaultBatch registers fn for every kind without a handler of its
// own; each batch holds tasks of one kind (the binary's webhook handler in
// batch mode). Its runs take the tasks' own or the worker's timeout, so
// opts.Timeout must be 0. The error names a bad argument.
func (s *Service) HandleDefaultBatch(fn BatchHandler, opts BatchOptions) error {
	if opts.Timeout != 0 {
		return configError("BatchOptions.Timeout", "must be 0 for HandleDefaultBatch (the default handler's runs take Config.TaskTimeout), got %s", opts.Timeout)
	}
	return s.worker.handleBatch("", fn, opts)
}

// handleBatch registers fn for kind ("": every kind without a handler).
func (w *worker) handleBatch(kind string, fn BatchHandler, opts BatchOptions) error {
	if fn == nil {
		return errors.New("ingest: HandleBatch: nil handler")
	}
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("ingest: HandleBatch(%q): %w", kind, err)
	}
	if opts.Max > w.cfg.Concurrency {
		w.log.Warn("batch handler's Max exceeds the worker's concurrency: its batches hold at most Concurrency tasks and wait out Wait",
			"kind", kind, "max", opts.Max, "concurrency", w.cfg.Concurrency)
	}
	b := &batcher{fn: fn, opts: opts, log: w.log, size: w.proc.met.batchSize, pending: map[string]*pendingBatch{}}
	if kind == "" {
		w.handlers.handleDefault(ResultHandler(b.handle).fn())
		return nil
	}
	w.handlers.handle(kind, ResultHandler(b.handle).fn(), HandlerOptions{Timeout: opts.Timeout})
	return nil
}

// batcher gathers the runs of a batch handler's kinds into batches. It is
// registered as the kinds' ResultHandler, so each task keeps its own run
// in the processor (its slot, lease, deadline, completion): a run joins
// the pending batch of its kind and waits for its outcome; the run that
// fills the batch, or a timer Wait after its first run, hands the batch
// to the handler. Nothing of a batch is stored: a crash loses only runs,
// which are recovered like any other run (their leases expire).
type batcher struct {
	fn   BatchHandler
	opts BatchOptions
	log  *slog.Logger
	// size observes each call's number of tasks, by kind.
	size *prometheus.HistogramVec

	mu      sync.Mutex
	pending map[string]*pendingBatch // by kind
}

// pendingBatch is a batch still filling.
type pendingBatch struct {
	kind  string
	items []*batchItem
	timer *time.Timer
}

// batchItem is one run waiting in, or handled by, a batch.
type batchItem struct {
	ctx  context.Context
	task Task
	// taken is set (under batcher.mu) once the batch holding the item is
	// handed over: the item gets its result on done.
	taken bool
	done  chan batchResult // buffered: the batch never blocks
}

type batchResult struct {
	result json.RawMessage
	err    error
}

// handle is the ResultHandler of a batch handler's kinds: one run's part.
func (b *batcher) handle(ctx context.Context, t Task) (json.RawMessage, error) {
	it := &batchItem{ctx: ctx, task: t, done: make(chan batchResult, 1)}
	b.join(it)
	select {
	case r := <-it.done:
		return r.result, r.err
	case <-ctx.Done():
	}
	if b.leave(it) {
		return nil, fmt.Errorf("waiting for a batch: %w", context.Cause(ctx))
	}
	r := <-it.done // the batch has it: its outcome comes
	return r.result, r.err
}

// join adds it to the pending batch of its kind, handing the batch over
// when it is full; the first item of a batch starts its Wait.
func (b *batcher) join(it *batchItem) {
	b.mu.Lock()
	defer b.mu.Unlock()
	kind := it.task.Kind
	pb := b.pending[kind]
	if pb == nil {
		pb = &pendingBatch{kind: kind}
		b.pending[kind] = pb
		pb.timer = time.AfterFunc(b.opts.Wait, func() { b.flush(pb) })
	}
	pb.items = append(pb.items, it)
	if len(pb.items) >= b.opts.Max {
		pb.timer.Stop()
		go b.run(b.takeLocked(pb))
	}
}

// flush hands pb over once its Wait has passed, unless it was handed over
// (full) or emptied meanwhile.
func (b *batcher) flush(pb *pendingBatch) {
	b.mu.Lock()
	if b.pending[pb.kind] != pb {
		b.mu.Unlock()
		return
	}
	items := b.takeLocked(pb)
	b.mu.Unlock()
	b.run(items)
}

// takeLocked ends pb's filling and returns its items, marked taken.
func (b *batcher) takeLocked(pb *pendingBatch) []*batchItem {
	delete(b.pending, pb.kind)
	for _, it := range pb.items {
		it.taken = true
	}
	return pb.items
}

// leave removes it, whose run ended while it waited (cancel, lease lost,
// shutdown, timeout), from its pending batch and reports true, unless its
// batch was handed over already.
func (b *batcher) leave(it *batchItem) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if it.taken {
		return false
	}
	pb := b.pending[it.task.Kind]
	for i, x := range pb.items {
		if x == it {
			pb.items = append(pb.items[:i], pb.items[i+1:]...)
			break
		}
	}
	if len(pb.items) == 0 {
		pb.timer.Stop()
		delete(b.pending, pb.kind)
	}
	return true
}

// run calls the handler on the items whose runs are still live and gives
// every item its result.
func (b *batcher) run(items []*batchItem) {
	live := items[:0:0]
	for _, it := range items {
		if err := it.ctx.Err(); err != nil {
			it.done <- batchResult{err: fmt.Errorf("waiting for a batch: %w", context.Cause(it.ctx))}
			continue
		}
		live = append(live, it)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ctx, span := startBatch(ctx, live)
	defer span.End()
	b.size.WithLabelValues(live[0].task.Kind).Observe(float64(len(live)))
	var left atomic.Int64
	left.Store(int64(len(live)))
	tasks := make([]Task, len(live))
	for i, it := range live {
		tasks[i] = it.task
		tasks[i].ctx = it.ctx
		stop := context.AfterFunc(it.ctx, func() {
			if left.Add(-1) == 0 {
				cancel(context.Cause(it.ctx))
			}
		})
		defer stop()
	}
	outs, err := callBatch(ctx, b.fn, tasks)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	for _, m := range b.match(live, outs, err) {
		m.it.done <- m.res
	}
}

// startBatch starts the span of a batch handler's call: a root span (the
// batch serves tasks of many traces) linked to each task's attempt span,
// the parent of the handler's spans.
func startBatch(ctx context.Context, items []*batchItem) (context.Context, trace.Span) {
	links := make([]trace.Link, 0, len(items))
	for _, it := range items {
		if sc := trace.SpanContextFromContext(it.ctx); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return tracing.Tracer().Start(ctx, tracing.SpanBatch,
		trace.WithNewRoot(),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String(tracing.AttrTaskKind, items[0].task.Kind),
			attribute.Int(tracing.AttrTaskCount, len(items)),
		))
}

// matched is an item with its result.
type matched struct {
	it  *batchItem
	res batchResult
}

// match pairs the items with the handler's outcomes (err: the handler's
// error, which fails them all).
func (b *batcher) match(items []*batchItem, outs []Outcome, err error) []matched {
	res := make([]matched, len(items))
	byID := make(map[uuid.UUID]int, len(items))
	for i, it := range items {
		res[i].it = it
		byID[it.task.ID] = i
	}
	if err != nil {
		for i := range res {
			res[i].res.err = err
		}
		return res
	}
	seen := make([]int, len(items))
	strangers := 0
	for _, o := range outs {
		i, ok := byID[o.TaskID]
		if !ok {
			strangers++
			b.log.Warn("batch handler returned an outcome for a task not in its batch; ignored", "task_id", o.TaskID, "kind", items[0].task.Kind)
			continue
		}
		seen[i]++
		if seen[i] > 1 {
			continue
		}
		if o.Err != nil {
			res[i].res.err = o.Err
			continue
		}
		res[i].res.result, res[i].res.err = marshalResult(o.Result)
	}
	for i, n := range seen {
		switch {
		case n == 0 && strangers > 0:
			res[i].res = batchResult{err: fmt.Errorf("batch handler returned no outcome for task %s (a batch of %d; %d outcomes named tasks not in the batch: build them with Task.Outcome)", items[i].task.ID, len(items), strangers)}
		case n == 0:
			res[i].res = batchResult{err: fmt.Errorf("batch handler returned no outcome for task %s (a batch of %d)", items[i].task.ID, len(items))}
		case n > 1:
			res[i].res = batchResult{err: fmt.Errorf("batch handler returned %d outcomes for task %s", n, items[i].task.ID)}
		}
	}
	return res
}

// marshalResult returns v as JSON: a json.RawMessage as it is (checked by
// the store like any result), nil as no result.
func marshalResult(v any) (json.RawMessage, error) {
	switch r := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return r, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("result: %w", err)
	}
	return b, nil
}

// callBatch runs fn, turning a panic into an error with the panic value
// and a short stack.
func callBatch(ctx context.Context, fn BatchHandler, tasks []Task) (outs []Outcome, err error) {
	defer func() {
		if v := recover(); v != nil {
			outs, err = nil, fmt.Errorf("batch handler panic: %v\n%s", v, shortStack())
		}
	}()
	return fn(ctx, tasks)
}
