package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/defaults"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Defaults of DESIGN §5 and of the worker's internals.
const (
	DefaultStream          = stream.DefaultStream
	DefaultGroup           = stream.DefaultGroup
	DefaultDLQ             = dlq.DefaultStream
	DefaultConcurrency     = 16
	DefaultTaskLease       = 30 * time.Second
	DefaultTaskTimeout     = 5 * time.Minute
	DefaultShutdownTimeout = 30 * time.Second
	DefaultReclaimIdle     = 10 * time.Minute
	DefaultBlock           = stream.DefaultBlock
	// DefaultCompleteBatch and DefaultCompleteWindow bound how many
	// outcomes the completer gathers into one store call, and for how long.
	DefaultCompleteBatch  = 64
	DefaultCompleteWindow = 2 * time.Millisecond
	// DefaultCompleteParallel is how many completer batches may be
	// committing at once.
	DefaultCompleteParallel = 4
)

// Config configures a Worker. Zero fields take the Default* values.
type Config struct {
	// Stream, Group: the task stream and its consumer group.
	Stream string
	Group  string
	// DLQ is the dead-letter stream (DefaultDLQ when ""); it needs the
	// task stream's hash tag on Redis Cluster.
	DLQ string
	// NoDLQ writes no DLQ entries: a dead task's entry is only acknowledged
	// (DEAD state only). INGEST_REDIS_DLQ_STREAM_KEY="" maps to it.
	NoDLQ bool
	// Consumer is this worker's consumer name and lease owner; it must be
	// unique among live workers. Default: hostname-pid.
	Consumer string
	// Concurrency is the number of handler slots.
	Concurrency int
	// TaskLease is how long a started task is held without renewal; the
	// heartbeat renews it every TaskLease/3.
	TaskLease time.Duration
	// TaskTimeout is the deadline of a handler's context.
	TaskTimeout time.Duration
	// ShutdownTimeout is how long running handlers may finish after Run's
	// context is cancelled, before they are cancelled and their tasks
	// handed back.
	ShutdownTimeout time.Duration
	// ReclaimIdle is the reclaimer's min-idle time
	// (INGEST_REDIS_RECLAIM_IDLE_MS). The worker sets the idle time of
	// entries it leaves pending relative to it, so that they become
	// claimable exactly when they should run again.
	ReclaimIdle time.Duration
	// Block bounds one blocking stream read (and so shutdown latency).
	Block time.Duration
	// CompleteBatch and CompleteWindow bound the completer's batches;
	// CompleteParallel is how many batches may be committing at once.
	CompleteBatch    int
	CompleteWindow   time.Duration
	CompleteParallel int
	// ReadCount is the most entries one stream read asks for (fewer when
	// fewer handler slots are free); all of them are started in one
	// statement. Default stream.DefaultCount.
	ReadCount int

	// OnSucceeded, when set, is called by the completer right after the
	// transaction that made ids SUCCEEDED committed (before their entries
	// are acknowledged). It is for benchmarks and tests measuring
	// completion latency; it must return quickly and may be called from
	// several goroutines at once.
	OnSucceeded func(ids []uuid.UUID)
}

// DefaultConsumer returns hostname-pid.
func DefaultConsumer() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

func (c *Config) setDefaults() {
	defaults.Set(&c.Stream, DefaultStream)
	defaults.Set(&c.Group, DefaultGroup)
	if c.DLQ == "" && !c.NoDLQ {
		c.DLQ = DefaultDLQ
	}
	if c.NoDLQ {
		c.DLQ = ""
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer() // asks the OS: only when needed
	}
	defaults.Set(&c.Concurrency, DefaultConcurrency)
	defaults.Set(&c.CompleteBatch, DefaultCompleteBatch)
	defaults.Set(&c.CompleteParallel, DefaultCompleteParallel)
	defaults.Set(&c.ReadCount, stream.DefaultCount)
	defaults.Set(&c.TaskLease, DefaultTaskLease)
	defaults.Set(&c.TaskTimeout, DefaultTaskTimeout)
	defaults.Set(&c.ShutdownTimeout, DefaultShutdownTimeout)
	defaults.Set(&c.ReclaimIdle, DefaultReclaimIdle)
	defaults.Set(&c.Block, DefaultBlock)
	defaults.Set(&c.CompleteWindow, DefaultCompleteWindow)
}

// Validate checks the configuration and names the bad field.
func (c Config) Validate() error {
	switch {
	case c.Concurrency < 1 || c.Concurrency > 100000:
		return fmt.Errorf("invalid Concurrency: must be between 1 and 100000, got %d", c.Concurrency)
	case c.TaskLease < 3*time.Millisecond:
		return fmt.Errorf("invalid TaskLease: must be >= 3ms, got %s", c.TaskLease)
	case c.TaskTimeout <= 0:
		return fmt.Errorf("invalid TaskTimeout: must be > 0, got %s", c.TaskTimeout)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("invalid ShutdownTimeout: must be >= 0, got %s", c.ShutdownTimeout)
	case c.ReclaimIdle <= c.TaskLease/3:
		return fmt.Errorf("invalid ReclaimIdle (%s): must be greater than the heartbeat interval TaskLease/3 (%s)", c.ReclaimIdle, c.TaskLease/3)
	case c.CompleteBatch < 1:
		return fmt.Errorf("invalid CompleteBatch: must be >= 1, got %d", c.CompleteBatch)
	case c.CompleteParallel < 1 || c.CompleteParallel > 64:
		return fmt.Errorf("invalid CompleteParallel: must be between 1 and 64, got %d", c.CompleteParallel)
	case c.ReadCount < 1:
		return fmt.Errorf("invalid ReadCount: must be >= 1, got %d", c.ReadCount)
	case c.CompleteWindow < 0:
		return fmt.Errorf("invalid CompleteWindow: must be >= 0, got %s", c.CompleteWindow)
	case c.DLQ != "" && c.DLQ == c.Stream:
		return fmt.Errorf("invalid DLQ: must differ from Stream (%q)", c.Stream)
	}
	return nil
}

// hardStopWait is how long Run waits, after cancelling handlers at the end
// of the grace period, for handlers to return; finalFlushTimeout bounds the
// completer's last store calls.
const (
	hardStopWait      = 5 * time.Second
	finalFlushTimeout = 10 * time.Second
)

// errShutdown is the cause of handler contexts cancelled at the end of the
// shutdown grace period.
var errShutdown = errors.New("worker shutting down")

// Worker runs tasks delivered through the stream: it joins the consumer
// group, the task store and the DLQ. Register handlers with Handle, then
// call Run once.
type Worker struct {
	cfg      Config
	store    *task.Store
	group    *stream.Group
	consumer *stream.Consumer
	dlq      *dlq.Writer
	log      *slog.Logger
	met      *metrics
	proc     *processor

	mu       sync.RWMutex
	handlers map[string]Handler
	fallback Handler // for kinds without a handler; nil: none
	ran      atomic.Bool
}

// New returns a worker. logger may be nil (no logs); reg may be nil (no
// metrics exported). The retry backoff is the store's (task.Config.Backoff).
func New(cfg Config, store *task.Store, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Worker, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("worker config: %w", err)
	}
	if store == nil {
		return nil, errors.New("worker: nil task store")
	}
	if rdb == nil {
		return nil, errors.New("worker: nil redis client")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	w := &Worker{
		cfg:      cfg,
		store:    store,
		log:      logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer),
		handlers: map[string]Handler{},
	}
	scfg := stream.Config{Stream: cfg.Stream, Group: cfg.Group, Consumer: cfg.Consumer, Block: cfg.Block, Count: cfg.ReadCount}
	var err error
	if w.group, err = stream.NewGroup(scfg, rdb); err != nil {
		return nil, err
	}
	if w.dlq, err = dlq.NewWriter(dlq.Config{Stream: cfg.Stream, Group: cfg.Group, DLQ: cfg.DLQ}, rdb); err != nil {
		return nil, err
	}
	if w.met, err = newMetrics(reg, w.group, w.log); err != nil {
		return nil, err
	}
	w.proc = newProcessor(w)
	if w.consumer, err = stream.NewConsumer(scfg, rdb, w.proc, logger); err != nil {
		return nil, err
	}
	return w, nil
}

// Config returns the configuration with defaults filled in.
func (w *Worker) Config() Config { return w.cfg }

// Handle registers h for tasks of kind, replacing an earlier one. A task of
// a kind without a handler fails (and is retried: a later deploy may
// register it). It panics on an empty kind or a nil handler.
func (w *Worker) Handle(kind string, h Handler) {
	if kind == "" || h == nil {
		panic("ingest: Handle needs a kind and a handler")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers[kind] = h
}

// HandleDefault registers h for every kind without a handler of its own
// (the binary's webhook handler serves all kinds this way). It panics on a
// nil handler.
func (w *Worker) HandleDefault(h Handler) {
	if h == nil {
		panic("ingest: HandleDefault needs a handler")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fallback = h
}

func (w *Worker) handler(kind string) Handler {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if h, ok := w.handlers[kind]; ok {
		return h
	}
	return w.fallback
}

// Sink returns the processing path, for the reclaimer to feed claimed
// entries into: they are handled exactly like fresh deliveries.
func (w *Worker) Sink() stream.Sink { return w.proc }

// Run consumes tasks until ctx is cancelled, then shuts down gracefully and
// returns nil. It may be called once.
//
// Shutdown order:
//  1. The consumer stops reading (within Config.Block). From now on the
//     Sink starts nothing: entries delivered to it (by the reclaimer) are
//     made claimable at once for another worker.
//  2. Grace period (Config.ShutdownTimeout): running handlers may finish;
//     the heartbeat keeps renewing their leases and entries, the completer
//     records their outcomes and acknowledges.
//  3. Cut-off: the remaining handlers' contexts are cancelled. A handler
//     that then returns an error has its task released (RETRYING, due now,
//     no failure counted) and its entry made claimable at once; one that
//     returns nil succeeded. Nothing that did not finish is acknowledged.
//  4. The completer records the last outcomes, then the heartbeat stops,
//     then all Redis and Postgres I/O is cancelled (a DLQ write still being
//     retried gives up and leaves its entry pending).
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("ingest: Worker.Run may be called only once")
	}
	p := w.proc
	stopCompleter, completerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(completerDone)
		p.runCompleter(stopCompleter)
	}()
	stopHeartbeat, heartbeatDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(heartbeatDone)
		p.runHeartbeat(stopHeartbeat)
	}()
	w.log.Info("worker started", "concurrency", w.cfg.Concurrency)

	_ = w.consumer.Run(ctx)

	// 1.
	p.drain()
	w.log.Info("worker stopping: waiting for running handlers", "running", p.runningCount(), "timeout", w.cfg.ShutdownTimeout)
	// 2.
	workDone := p.workDone()
	if !waitFor(workDone, w.cfg.ShutdownTimeout) {
		// 3.
		w.log.Warn("shutdown timeout: cancelling running handlers", "running", p.runningCount())
		p.stopHandlers(errShutdown)
		if !waitFor(workDone, hardStopWait) {
			w.log.Error("handlers ignore cancellation; their tasks are recovered when their leases expire", "running", p.runningCount())
		}
	}
	// 4.
	close(stopCompleter)
	if !waitFor(completerDone, finalFlushTimeout) {
		w.log.Error("recording the last outcomes timed out; their entries stay pending")
		p.stopIO()
		<-completerDone
	}
	close(stopHeartbeat)
	<-heartbeatDone
	p.stopIO()
	p.retries.Wait()
	w.log.Info("worker stopped")
	return nil
}

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
