package ingest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// startRetryDelay is when an entry whose start failed (Postgres
// unreachable) becomes claimable again.
const startRetryDelay = 5 * time.Second

// parkTimeout bounds the XCLAIM that hands entries back during shutdown.
const parkTimeout = 5 * time.Second

// errLeaseLost is the cause of a handler context cancelled because the
// heartbeat found the task's lease taken over.
var errLeaseLost = errors.New("task lease lost")

// delivery is one stream entry handed to the Sink.
type delivery struct {
	msg      redis.XMessage
	received time.Time
}

// run is one started task: its handler runs, or its outcome is not yet
// committed.
type run struct {
	d      delivery
	task   Task
	cancel context.CancelCauseFunc
	// returned is set once the handler returned (under processor.mu).
	returned bool
	// lost is set once the heartbeat found the lease lost (under mu).
	lost bool
}

// outcome is what a handler run produced, for the completer.
type outcome struct {
	r   *run
	err error
	// released: cut off by shutdown; hand the task back, no failure.
	released bool
}

// letter is an entry to dead-letter.
type letter struct {
	d      delivery
	entry  dlq.Entry
	result string // metric result: dead or poison
}

// processor is the Sink: it starts delivered entries as one batch, runs
// handlers in bounded slots and settles every entry (ack, idle time, DLQ).
type processor struct {
	w *Worker

	// ioCtx carries all Redis and Postgres I/O; cancelled last at shutdown.
	ioCtx  context.Context
	stopIO context.CancelFunc
	// handlerCtx is the parent of handler contexts; cancelled (cause
	// errShutdown) at the end of the shutdown grace period.
	handlerCtx   context.Context
	stopHandlers context.CancelCauseFunc

	mu       sync.Mutex
	free     int                  // free handler slots
	draining bool                 // shutting down: start nothing new
	inflight map[string]bool      // entry ids being handled here
	running  map[string]*run      // by entry id
	byTask   map[uuid.UUID]string // task id → entry id of its run

	// settleMu serialises the heartbeat's refresh of idle times with the
	// settling of entries (ack, idle time set, leaving the in-flight set),
	// so a refresh never overwrites the idle time an entry was settled with.
	settleMu sync.Mutex
	// touching is set while a heartbeat's idle-time refresh runs (touches
	// tracks it for shutdown).
	touching atomic.Bool
	touches  sync.WaitGroup

	freed    chan struct{} // signalled when slots are released
	outcomes chan outcome  // handlers → completer; capacity = Concurrency
	work     sync.WaitGroup
	retries  sync.WaitGroup // DLQ writes being retried
}

func newProcessor(w *Worker) *processor {
	p := &processor{
		w:        w,
		free:     w.cfg.Concurrency,
		inflight: map[string]bool{},
		running:  map[string]*run{},
		byTask:   map[uuid.UUID]string{},
		freed:    make(chan struct{}, 1),
		// Every outcome holds a slot until the completer settles it, so
		// handlers never block on this channel.
		outcomes: make(chan outcome, w.cfg.Concurrency),
	}
	p.ioCtx, p.stopIO = context.WithCancel(context.Background())
	p.handlerCtx, p.stopHandlers = context.WithCancelCause(p.ioCtx)
	return p
}

// Reserve implements stream.Sink.
func (p *processor) Reserve(n int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = max(0, min(n, p.free))
	p.free -= n
	return n
}

// SlotFreed implements stream.SlotNotifier.
func (p *processor) SlotFreed() <-chan struct{} { return p.freed }

func (p *processor) releaseLocked(n int) {
	if n <= 0 {
		return
	}
	p.free += n
	select {
	case p.freed <- struct{}{}:
	default:
	}
}

// Process implements stream.Sink: it starts the entries' tasks in one store
// call on a goroutine of its own and returns at once. ctx bounds only the
// hand-back of entries delivered during shutdown; the handling of the
// entries belongs to the worker (see Worker.Run).
func (p *processor) Process(ctx context.Context, msgs []redis.XMessage, reserved int) {
	now := time.Now()
	p.mu.Lock()
	if over := len(msgs) - reserved; over > 0 {
		p.free -= over // a caller broke the protocol; keep the count exact
	}
	p.releaseLocked(reserved - len(msgs))
	var batch []delivery
	var park []string
	for _, m := range msgs {
		switch {
		case p.inflight[m.ID]:
			// Delivered again (reclaimed, own-PEL re-read) while it is
			// handled here: this handling settles it.
			p.releaseLocked(1)
			p.w.log.Debug("entry delivered again while handled here", "message_id", m.ID)
		case p.draining:
			p.releaseLocked(1)
			park = append(park, m.ID)
		default:
			p.inflight[m.ID] = true
			batch = append(batch, delivery{msg: m, received: now})
		}
	}
	if len(batch) > 0 {
		p.work.Add(1)
	}
	p.mu.Unlock()
	if len(park) > 0 {
		p.park(ctx, park)
	}
	if len(batch) > 0 {
		go func() {
			defer p.work.Done()
			p.start(batch)
		}()
	}
}

// park makes entries delivered during shutdown claimable at once by
// another worker.
func (p *processor) park(ctx context.Context, ids []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), parkTimeout)
	defer cancel()
	if err := p.w.group.SetIdle(ctx, p.w.cfg.ReclaimIdle, ids...); err != nil {
		p.w.log.Warn("hand back entries delivered during shutdown failed; they are reclaimed later", "err", err)
	}
}

// drain makes Process start nothing from now on.
func (p *processor) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draining = true
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

func (p *processor) runningCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.running)
}

// settled ends the handling of entries: they leave the in-flight set and
// give back their slots.
func (p *processor) settled(ds ...delivery) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked(ds)
	p.releaseLocked(len(ds))
}

// forgetLocked removes entries from the in-flight set, keeping their slots.
func (p *processor) forgetLocked(ds []delivery) {
	for _, d := range ds {
		if r, ok := p.running[d.msg.ID]; ok {
			delete(p.running, d.msg.ID)
			if p.byTask[r.task.ID] == d.msg.ID {
				delete(p.byTask, r.task.ID)
			}
		}
		delete(p.inflight, d.msg.ID)
	}
}

// idleUntil returns the idle time that makes an entry claimable by the
// reclaimer (min-idle ReclaimIdle) at t: ReclaimIdle - (t - now), clamped
// to [0, ReclaimIdle].
func (p *processor) idleUntil(t *time.Time, now time.Time) time.Duration {
	idle := p.w.cfg.ReclaimIdle
	if t != nil {
		idle -= t.Sub(now)
	}
	return max(0, min(idle, p.w.cfg.ReclaimIdle))
}

// start starts the tasks of one read in one store call and settles or
// dispatches each entry.
func (p *processor) start(batch []delivery) {
	ctx, w := p.ioCtx, p.w
	var (
		acks    []string
		idles   []stream.Idle
		letters []letter
		settle  []delivery // settled after the Redis calls below
		valid   []delivery
		ids     []uuid.UUID
		taskOf  = map[string]uuid.UUID{}
		metric  = map[string]string{} // entry id → result
	)
	now := time.Now()
	for _, d := range batch {
		id, kind, err := stream.ParseEntry(d.msg)
		switch {
		case errors.Is(err, stream.ErrDeleted):
			// Its data is gone; the rescuer republishes the task from
			// Postgres if it still has to run.
			w.log.Info("pending entry was deleted from the stream; acknowledging it", "message_id", d.msg.ID)
			acks, settle = append(acks, d.msg.ID), append(settle, d)
			metric[d.msg.ID] = resultSkipped
		case err != nil:
			letters = append(letters, p.poison(d, kind, err.Error(), now))
		default:
			valid = append(valid, d)
			ids = append(ids, id)
			taskOf[d.msg.ID] = id
		}
	}
	var results map[uuid.UUID]task.StartResult
	if len(ids) > 0 {
		res, err := w.store.Start(ctx, w.cfg.Consumer, w.cfg.TaskLease, ids...)
		if err != nil {
			w.log.Error("start tasks failed; their entries come back later", "count", len(ids), "err", err)
			for _, d := range valid {
				idles = append(idles, stream.Idle{ID: d.msg.ID, Idle: max(0, w.cfg.ReclaimIdle-startRetryDelay)})
				settle = append(settle, d)
			}
			valid = nil
		}
		results = make(map[uuid.UUID]task.StartResult, len(res))
		for _, r := range res {
			results[r.ID] = r
		}
	}
	first := map[uuid.UUID]bool{}
	for _, d := range valid {
		id := taskOf[d.msg.ID]
		r := results[id]
		isFirst := !first[id]
		first[id] = true
		log := w.log.With("task_id", id, "message_id", d.msg.ID)
		switch {
		case r.Outcome == task.Started && isFirst:
			if r.TookOver {
				log.Info("took over a task whose lease expired; the abandoned run counted as a failure", "attempt", r.Task.AttemptCount+1)
			}
			p.dispatch(d, r.Task)
			continue
		case r.Outcome == task.Started || (r.Died && !isFirst):
			// Another entry of this batch runs (or buried) the task.
			log.Debug("duplicate entry of a task started by this read; acknowledging it")
			acks = append(acks, d.msg.ID)
			metric[d.msg.ID] = resultSkipped
		case r.Died:
			log.Warn("took over a task whose lease expired on its last attempt: DEAD", "attempt", r.Task.AttemptCount)
			letters = append(letters, p.taskLetter(d, r.Task, resultDead, now))
			continue
		case r.Outcome == task.Skipped && r.Task != nil && r.Task.Status == task.Dead:
			// A redelivery after a crash between the DEAD commit and the
			// DLQ write, or a duplicate entry: the DLQ gets this death once.
			log.Debug("task already DEAD; making sure its death is dead-lettered")
			letters = append(letters, p.taskLetter(d, r.Task, resultSkipped, now))
			continue
		case r.Outcome == task.Skipped && r.Task != nil && r.Task.Status.Terminal():
			log.Debug("task already finished; acknowledging duplicate delivery", "to", r.Task.Status)
			acks = append(acks, d.msg.ID)
			metric[d.msg.ID] = resultSkipped
		case r.Outcome == task.Skipped && r.Task != nil && p.runsHere(r.Task):
			log.Debug("duplicate entry of a task running here; acknowledging it")
			acks = append(acks, d.msg.ID)
			metric[d.msg.ID] = resultSkipped
		case r.Outcome == task.Skipped && r.Task != nil:
			// Another worker holds a live lease: look again when it expires.
			idles = append(idles, stream.Idle{ID: d.msg.ID, Idle: p.idleUntil(r.Task.LeaseUntil, now)})
			metric[d.msg.ID] = resultSkipped
		case r.Outcome == task.NotDue && r.Task != nil:
			idles = append(idles, stream.Idle{ID: d.msg.ID, Idle: p.idleUntil(r.Task.NextRetryAt, now)})
			metric[d.msg.ID] = resultNotDue
		default: // NotFound
			letters = append(letters, p.poison(d, stream.FieldString(d.msg, stream.FieldKind),
				fmt.Sprintf("unknown task: no task %s in Postgres", id), now))
			continue
		}
		settle = append(settle, d)
	}
	p.settle(acks, idles, settle, metric)
	p.deadLetter(letters)
}

// settle acknowledges acks and sets idles in one pipeline, then ends the
// handling of ds, counting each under its result in metric.
func (p *processor) settle(acks []string, idles []stream.Idle, ds []delivery, metric map[string]string) {
	p.settleMu.Lock()
	defer p.settleMu.Unlock()
	if err := p.w.group.Apply(p.ioCtx, acks, idles); err != nil {
		p.w.log.Warn("acknowledge / set idle time failed; the entries are reclaimed later", "err", err)
	}
	for _, d := range ds {
		p.w.met.observe(metric[d.msg.ID], d.received)
	}
	p.settled(ds...)
}

// runsHere reports whether t is RUNNING under this worker's lease for a
// run of another entry.
func (p *processor) runsHere(t *task.Task) bool {
	if t.Status != task.Running || t.LeaseOwner != p.w.cfg.Consumer {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.byTask[t.ID]
	return ok
}

func (p *processor) poison(d delivery, kind, reason string, now time.Time) letter {
	p.w.log.Warn("entry of no task: dead-lettering it", "message_id", d.msg.ID, "err", reason)
	return letter{d: d, result: resultPoison, entry: dlq.Entry{
		TaskID:    stream.Truncate(stream.FieldString(d.msg, stream.FieldTaskID), 200),
		Kind:      stream.Truncate(kind, 200),
		LastError: reason,
		SourceID:  d.msg.ID,
		DeadAt:    now,
	}}
}

func (p *processor) taskLetter(d delivery, t *task.Task, result string, now time.Time) letter {
	e := dlq.Entry{
		TaskID:       t.ID.String(),
		Kind:         t.Kind,
		AttemptCount: t.AttemptCount,
		LastError:    t.LastError,
		SourceID:     d.msg.ID,
		DeadAt:       now,
	}
	if t.FinishedAt != nil {
		e.DeadAt = *t.FinishedAt
		e.Death = t.ID.String() + ":" + strconv.FormatInt(t.FinishedAt.UnixMicro(), 10)
	}
	return letter{d: d, result: result, entry: e}
}

// dispatch runs the handler of a started task in its slot.
func (p *processor) dispatch(d delivery, t *task.Task) {
	// From here on only the entry id is needed; the parsed fields would
	// stay alive for as long as the handler runs.
	d.msg.Values = nil
	hctx, cancel := context.WithCancelCause(p.handlerCtx)
	r := &run{d: d, cancel: cancel, task: Task{
		ID:          t.ID,
		Kind:        t.Kind,
		Payload:     t.Payload,
		Attempt:     t.AttemptCount + 1,
		MaxAttempts: t.MaxAttempts,
	}}
	p.mu.Lock()
	p.running[d.msg.ID] = r
	p.byTask[t.ID] = d.msg.ID
	p.work.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.work.Done()
		p.execute(hctx, r)
	}()
}

// execute runs one handler and hands its outcome to the completer.
func (p *processor) execute(ctx context.Context, r *run) {
	timeout := p.w.cfg.TaskTimeout
	tctx, cancel := context.WithTimeout(ctx, timeout)
	err := call(tctx, p.w.handler(r.task.Kind), r.task)
	timedOut := errors.Is(tctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil
	cancel()
	o := outcome{r: r, err: err}
	if err != nil {
		switch {
		case errors.Is(context.Cause(ctx), errShutdown):
			o.released = true
		case timedOut:
			o.err = fmt.Errorf("task timeout after %s: %w", timeout, err)
		}
	}
	p.mu.Lock()
	r.returned = true
	p.mu.Unlock()
	r.cancel(nil)
	p.outcomes <- o
}

// call runs h, turning a panic into an error with the panic value and a
// short stack.
func call(ctx context.Context, h Handler, t Task) (err error) {
	if h == nil {
		return fmt.Errorf("no handler registered for task kind %q", t.Kind)
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v\n%s", v, shortStack())
		}
	}()
	return h(ctx, t)
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
		if !more || count == 8 || strings.HasSuffix(f.Function, "ingest.call") {
			break
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// deadLetter writes letters to the DLQ (each with its ack, atomically). A
// write that fails keeps its entry here, pending and kept fresh by the
// heartbeat, and is retried until it succeeds or the worker stops.
//
// A retried entry gives back its handler slot at once (a broken DLQ must not
// stall healthy tasks) but stays in the in-flight set, so a redelivery of it
// is ignored.
func (p *processor) deadLetter(letters []letter) {
	for _, l := range letters {
		if err := p.writeLetter(l); err != nil {
			p.w.log.Error("dead-letter failed; the entry stays pending and the write is retried",
				"task_id", l.entry.TaskID, "message_id", l.d.msg.ID, "err", err)
			p.mu.Lock()
			p.releaseLocked(1)
			p.mu.Unlock()
			p.retries.Add(1)
			go p.retryLetter(l)
			continue
		}
		p.settled(l.d)
	}
}

// writeLetter runs the DLQ script for l and counts it.
func (p *processor) writeLetter(l letter) error {
	id, err := p.w.dlq.Write(p.ioCtx, l.entry)
	if err != nil {
		return err
	}
	if id != "" {
		p.w.met.dlq.Inc()
	}
	p.w.met.observe(l.result, l.d.received)
	return nil
}

func (p *processor) forget(d delivery) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked([]delivery{d})
}

func (p *processor) retryLetter(l letter) {
	defer p.retries.Done()
	delay := 200 * time.Millisecond
	t := time.NewTimer(delay)
	defer t.Stop()
	for {
		select {
		case <-p.ioCtx.Done():
			p.w.log.Error("worker stopped before the dead-letter could be written; the entry stays pending",
				"task_id", l.entry.TaskID, "message_id", l.d.msg.ID)
			p.forget(l.d)
			return
		case <-t.C:
		}
		err := p.writeLetter(l)
		if err == nil {
			p.forget(l.d)
			p.w.log.Info("dead-letter written after retrying", "task_id", l.entry.TaskID, "message_id", l.d.msg.ID)
			return
		}
		p.w.log.Debug("dead-letter retry failed", "task_id", l.entry.TaskID, "message_id", l.d.msg.ID, "err", err)
		delay = min(2*delay, 5*time.Second)
		t.Reset(delay)
	}
}

// heldEntries returns the ids of entries kept for a DLQ retry or a
// pending completion, which the heartbeat keeps fresh without a lease.
func (p *processor) heldEntries() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for id := range p.inflight {
		if _, ok := p.running[id]; !ok {
			ids = append(ids, id)
		}
	}
	return ids
}
