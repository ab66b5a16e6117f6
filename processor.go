package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/ingest-worker/ingest/task"
)

// handBackTimeout bounds the XCLAIM that hands entries back during
// shutdown.
const handBackTimeout = 5 * time.Second

// errLeaseLost is the cause of a handler context cancelled because the
// heartbeat found the task's lease taken over.
var errLeaseLost = errors.New("task lease lost")

// errLeaseStale is the cause of the context of a run whose lease could not
// be confirmed before its handler was called (processor.confirmLease): it
// is released unrun (RETRYING, due now, no failure counted).
var errLeaseStale = errors.New("the lease of a task waiting for a handler slot could not be confirmed")

// staleAfter is how long after its lease was last known renewed a task's
// lease is confirmed before its handler is called (a task started ahead
// waits for a handler slot while the heartbeat is late or failing): two
// thirds of the lease, so a heartbeat (every third of a lease) may be
// late by a whole period.
func staleAfter(lease time.Duration) time.Duration { return lease * 2 / 3 }

// delivery is one queued message handed to the processor, whatever the
// transport: a stream entry (Redis) or a record (Kafka), parsed.
type delivery struct {
	// id names the message to its transport: the entry id, or the
	// record's position.
	id string
	// taskID and kind are the parsed message; err is set when it names no
	// valid task (poison), deleted when its data is gone (a trimmed
	// pending entry).
	taskID  uuid.UUID
	kind    string
	err     error
	deleted bool
	// rawTaskID is the task id as the message had it, for a poison letter.
	rawTaskID string
	// traceparent is the message's trace context ("" when none); the task
	// row's, when it has one, wins.
	traceparent string
	received    time.Time
}

// run is one started task: its handler runs, or its outcome is not yet
// recorded and its message not yet settled.
type run struct {
	d      delivery
	task   Task
	cancel context.CancelCauseFunc
	// returned is set once the handler returned; slot while the run holds
	// a handler slot; leased is when its lease was last known taken or
	// renewed (all under inflight.mu).
	returned bool
	slot     bool
	leased   time.Time
	// lost is set once the heartbeat found the lease lost, or the handler
	// outran its timeout by a lease (under mu).
	lost bool
	// cancelled is set once an operator's cancel reached the handler
	// (under mu; see heartbeater.cancelRun).
	cancelled bool
	// span is the attempt's span (see startAttempt), ended by the
	// completer; traceID is its trace id for log lines ("" when none).
	span    trace.Span
	traceID string
	// timeout is the run's deadline (0: none; see HandlerOptions), and
	// deadline what the run holds for it while its handler runs.
	timeout  time.Duration
	deadline *deadline
	// handler is the handler of the task's kind (none: the run fails).
	handler handlerFunc
	// err is why the handler must not be called, until it is (a payload
	// this worker cannot open, a key it lacks: a counted failed attempt,
	// retried with backoff, so a worker given the key later runs it; once
	// attempts are spent it is DEAD with this error, for a redrive: never
	// lost), then what the handler returned, with result; finish takes
	// both. called is set once the handler returned (not by a panic or
	// runtime.Goexit), and began when it was called. Only the run's
	// goroutine uses them.
	err    error
	result json.RawMessage
	called bool
	began  time.Time
}

// outcome is what a handler run produced, for the completer.
type outcome struct {
	r   *run
	err error
	// released: cut off by shutdown, or (unrun) not run because its lease
	// could not be confirmed after a wait for a handler slot; release the task
	// (RETRYING, due now, no failure counted) and hand its entry back.
	released, unrun bool
	// timedOut: the run hit the task timeout.
	timedOut bool
	// result is a successful run's checked result (nil: none).
	result json.RawMessage
}

// processor is the Sink: it starts delivered entries as one batch
// (start.go), runs handlers in bounded slots (a slot is free again once
// its handler has returned and handed its outcome to the completer; run.go)
// and settles every entry (ack, idle time, DLQ; settle.go). Its parts each
// own their state: inflight (message and handler slots, messages in
// flight, runs, the tasks waiting for a handler slot, draining), admission
// (the kinds' pauses and limits), the completer (outcomes → Postgres →
// transport; completer.go) and the heartbeater (lease renewal, idle-time
// refresh, cancel notices; heartbeat.go, cancel.go). launch starts the
// goroutines and shutdown stops everything in order.
type processor struct {
	processorDeps
	cfg Config
	// inflight holds the slots, the messages in flight and the runs.
	inflight *inflight
	// admission applies the kinds' pauses and limits to starts.
	admission *admission
	// completer records handlers' outcomes and settles their messages.
	completer *completer
	// heartbeater renews the runs' leases, keeps their entries fresh and
	// carries cancel requests to them.
	heartbeater *heartbeater
	// redeliverer hands deferred messages back at their time, where the
	// transport leaves them pending with this worker (nil otherwise;
	// redeliver.go).
	redeliverer *redeliverer

	// ioCtx carries all Redis and Postgres I/O; cancelled last at shutdown.
	ioCtx  context.Context
	stopIO context.CancelFunc
	// handlerCtx is the parent of handler contexts; cancelled (cause
	// errShutdown) at the end of the shutdown grace period.
	handlerCtx   context.Context
	stopHandlers context.CancelCauseFunc

	// settleMu serialises the heartbeat's refresh of idle times with the
	// settling of entries (ack, idle time set, leaving the in-flight set),
	// so a refresh never overwrites the idle time an entry was settled with.
	settleMu sync.Mutex

	work     sync.WaitGroup
	retries  sync.WaitGroup // DLQ writes being retried
	abandons sync.WaitGroup // entries of abandoned runs being handed over
}

// processorDeps are the processor's collaborators.
type processorDeps struct {
	store    *task.Store
	tr       transport
	log      *slog.Logger
	met      *metrics
	handlers *registry
}

// newProcessor returns a processor for cfg (defaults filled in).
func newProcessor(cfg Config, deps processorDeps) *processor {
	p := &processor{
		processorDeps: deps,
		cfg:           cfg,
		inflight:      newInflight(cfg.Concurrency, aheadSlots(cfg.Concurrency), staleAfter(cfg.TaskLease)),
		admission:     &admission{store: deps.store, log: deps.log, met: deps.met, owner: cfg.Consumer, lease: cfg.TaskLease},
	}
	p.admission.unflushed = deps.tr.redelivers()
	if deps.tr.redelivers() {
		p.redeliverer = newRedeliverer()
	}
	p.ioCtx, p.stopIO = context.WithCancel(context.Background())
	p.handlerCtx, p.stopHandlers = context.WithCancelCause(p.ioCtx)
	p.completer = newCompleter(p.ioCtx, cfg, deps.store, p, p.admission, deps.log)
	p.heartbeater = newHeartbeater(p.ioCtx, cfg, deps.store, deps.tr, p.inflight, &p.settleMu, deps.log)
	p.inflight.exec, p.inflight.startHeld = p.execute, p.startHeld
	return p
}

// launch starts the completer, the heartbeat and the cancel listener.
// onSucceeded is the benchmark hook (nil: none).
func (p *processor) launch(onSucceeded func([]uuid.UUID)) {
	p.completer.start(onSucceeded)
	p.heartbeater.start()
	if p.redeliverer != nil {
		go p.redeliverer.run(p.redeliver)
	}
}

// shutdown stops the processor once the readers feeding it have stopped,
// in this order:
//  1. From now on Process starts nothing: entries delivered to it (by the
//     reclaimer) are made claimable at once for another worker, as are
//     those waiting unstarted for a handler slot; the tasks started ahead
//     of the handler slots and waiting for one are released, not run; the
//     deferred entries kept for redelivery are left to the reclaimers.
//  2. Grace period (Config.ShutdownTimeout): running handlers may finish
//     and hand their outcomes to the completer; the heartbeat keeps
//     renewing the leases and entries of every run, returned or not, the
//     completer records outcomes and acknowledges.
//  3. Cut-off: the remaining handlers' contexts are cancelled. A handler
//     that then returns an error has its task released (RETRYING, due now,
//     no failure counted) and its entry made claimable at once; one that
//     returns nil succeeded. Nothing that did not finish is acknowledged.
//  4. The completer records every outcome still queued or being recorded
//     (within finalFlushTimeout; the heartbeat renews their runs' leases
//     meanwhile), then the heartbeat stops, then all Redis and Postgres
//     I/O is cancelled (a DLQ write still being retried gives up and leaves
//     its entry pending; the cancel listener stops).
func (p *processor) shutdown() {
	// 1.
	if p.redeliverer != nil {
		p.redeliverer.stop()
	}
	if back := p.inflight.drain(); len(back) > 0 {
		p.handBackHeld(p.ioCtx, back)
		for range back {
			p.work.Done() // theirs from holdLimited
		}
	}
	p.log.Info("worker stopping: waiting for running handlers", "running", p.inflight.runningCount(), "timeout", p.cfg.ShutdownTimeout)
	// 2.
	workDone := p.workDone()
	if !waitFor(workDone, p.cfg.ShutdownTimeout) {
		// 3.
		p.log.Warn("shutdown timeout: cancelling running handlers", "running", p.inflight.runningCount())
		p.stopHandlers(errShutdown)
		if !waitFor(workDone, hardStopWait) {
			p.log.Error("handlers ignore cancellation; their tasks are recovered when their leases expire", "running", p.inflight.runningCount())
		}
	}
	// 4.
	if !p.completer.stopWithin(finalFlushTimeout) {
		p.log.Error("recording the last outcomes timed out; their entries stay pending")
		p.stopIO()
		p.completer.wait()
	}
	p.heartbeater.stopBeating()
	p.stopIO()
	p.retries.Wait()
	p.abandons.Wait()
	p.admission.wait()
	p.heartbeater.waitListener()
}

// hardStopWait is how long shutdown waits, after cancelling handlers at the end
// of the grace period, for handlers to return; finalFlushTimeout bounds the
// completer's last store calls.
const (
	hardStopWait      = 5 * time.Second
	finalFlushTimeout = 10 * time.Second
)

// errShutdown is the cause of handler contexts cancelled at the end of the
// shutdown grace period.
var errShutdown = errors.New("worker shutting down")

// waitFor reports whether ch is closed within d.
func waitFor(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// Reserve implements stream.Sink.
func (p *processor) Reserve(n int) int { return p.inflight.reserve(n) }

// ReserveFirst implements stream.SlotWaiter, for the reclaimer.
func (p *processor) ReserveFirst(ctx context.Context, n int, wait time.Duration) int {
	return p.inflight.reserveFirst(ctx, n, wait)
}

// SlotFreed implements stream.SlotNotifier.
func (p *processor) SlotFreed() <-chan struct{} { return p.inflight.freed }

// process takes parsed deliveries of any transport: it starts their tasks
// in one store call on a goroutine of its own and returns at once. ctx
// bounds only the hand-back of entries delivered during shutdown; the
// handling of the entries belongs to the worker (see worker.run).
func (p *processor) process(ctx context.Context, msgs []delivery, reserved int) {
	// The batch counts as work from its admission on (under the lock that
	// drain takes), so shutdown waits for a batch admitted before drain.
	batch, handBack, again := p.inflight.admit(msgs, reserved, func() { p.work.Add(1) })
	for _, id := range again {
		p.log.Debug("entry delivered again while handled here", "message_id", id)
	}
	if len(handBack) > 0 {
		p.handBack(ctx, handBack)
	}
	if len(batch) == 0 {
		return
	}
	go func() {
		defer p.work.Done()
		p.start(batch, nil)
	}()
}

// handBack hands back entries delivered during shutdown, for another
// worker.
func (p *processor) handBack(ctx context.Context, ids []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handBackTimeout)
	defer cancel()
	if err := p.tr.handBack(ctx, ids); err != nil {
		p.log.Warn("hand back entries delivered during shutdown failed; they are reclaimed later", "err", err)
	}
}

// workDone returns a channel closed once every start batch and handler has
// returned. Call it only after drain.
func (p *processor) workDone() <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		p.work.Wait()
		close(ch)
	}()
	return ch
}
