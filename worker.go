package ingest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/hook"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Defaults of the worker (docs/ARCHITECTURE.md §5) and of its internals.
const (
	DefaultStream      = stream.DefaultStream
	DefaultGroup       = stream.DefaultGroup
	DefaultDLQ         = dlq.DefaultStream
	DefaultConcurrency = 16
	// MaxConcurrency bounds Config.Concurrency (INGEST_WORKER_CONCURRENCY).
	MaxConcurrency   = 100000
	DefaultTaskLease = 30 * time.Second
	// DefaultTaskTimeout is 0: no timeout (see Config.TaskTimeout).
	DefaultTaskTimeout     = time.Duration(0)
	DefaultShutdownTimeout = 30 * time.Second
	DefaultReclaimIdle     = reclaim.DefaultMinIdle
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
	// Concurrency is the number of handler slots, 1..MaxConcurrency.
	Concurrency int
	// TaskLease is how long a started task is held without renewal; the
	// heartbeat renews it every TaskLease/3.
	TaskLease time.Duration
	// TaskTimeout is the deadline of a handler's context for tasks without
	// a timeout of their own (timeout_ms) and of a kind without one
	// (HandlerOptions.Timeout); 0: none. See HandlerOptions for what
	// happens to a handler that ignores it.
	TaskTimeout time.Duration
	// ShutdownTimeout is how long running handlers may finish after Run's
	// context is cancelled, before they are cancelled and their tasks
	// handed back.
	ShutdownTimeout time.Duration
	// ReclaimIdle is the reclaimer's min-idle time
	// (INGEST_REDIS_RECLAIM_IDLE_MS). The worker sets the idle time of
	// entries it leaves pending relative to it, so that they become
	// claimable exactly when they should run again. time.Millisecond, the
	// least, re-drives failed entries at the next reclaim round; below the
	// heartbeat interval (TaskLease/3) the reclaimer also claims the
	// entries of running tasks and hands them back (the start guard never
	// runs a task twice), and crashed workers are found by their leases.
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
	// CancelListenDisabled turns off the worker's LISTEN on
	// task.CancelChannel (for a pooler that cannot LISTEN, or a store not
	// on a *pgxpool.Pool): a cancelled running task's handler is then
	// cancelled at the next lease renewal, within TaskLease/3, instead of
	// at once.
	CancelListenDisabled bool
}

// DefaultConsumer returns hostname-pid.
func DefaultConsumer() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// WithDefaults returns the configuration with every zero field set to
// its default (the consumer name is asked of the OS only when it is empty).
func (c Config) WithDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.Group = cmp.Or(c.Group, DefaultGroup)
	switch {
	case c.NoDLQ:
		c.DLQ = ""
	case c.DLQ == "":
		c.DLQ = DefaultDLQ
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer()
	}
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.CompleteBatch = cmp.Or(c.CompleteBatch, DefaultCompleteBatch)
	c.CompleteParallel = cmp.Or(c.CompleteParallel, DefaultCompleteParallel)
	c.ReadCount = cmp.Or(c.ReadCount, stream.DefaultCount)
	c.TaskLease = cmp.Or(c.TaskLease, DefaultTaskLease)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.ReclaimIdle = cmp.Or(c.ReclaimIdle, DefaultReclaimIdle)
	c.Block = cmp.Or(c.Block, DefaultBlock)
	c.CompleteWindow = cmp.Or(c.CompleteWindow, DefaultCompleteWindow)
	return c
}

// Validate checks the configuration, zero fields taking their defaults,
// and names the bad field.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.Concurrency < 1 || c.Concurrency > MaxConcurrency:
		return fmt.Errorf("invalid Concurrency: must be between 1 and %d, got %d", MaxConcurrency, c.Concurrency)
	case c.TaskLease < 3*time.Millisecond:
		return fmt.Errorf("invalid TaskLease: must be >= 3ms, got %s", c.TaskLease)
	case c.TaskTimeout < 0:
		return fmt.Errorf("invalid TaskTimeout: must be >= 0 (0: none), got %s", c.TaskTimeout)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("invalid ShutdownTimeout: must be >= 0, got %s", c.ShutdownTimeout)
	case c.ReclaimIdle < time.Millisecond:
		return fmt.Errorf("invalid ReclaimIdle: must be >= 1ms (Redis keeps idle times in whole milliseconds), got %s", c.ReclaimIdle)
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

// Worker runs tasks delivered through the stream: it joins the consumer
// group, the task store and the DLQ. Register handlers with Handle, then
// call Run once.
type Worker struct {
	cfg  Config
	proc *processor
	// consume reads messages into proc until its context is cancelled
	// (stream.Consumer.Run, or kafka.Consumer.Run); closeTransport, when
	// set, runs once proc has shut down (Kafka: the last commit).
	consume        func(context.Context) error
	closeTransport func()
	kafka          *kafka.Consumer  // Kafka mode only
	stream         *stream.Consumer // Redis mode only
	handlers       *registry
	log            *slog.Logger
	ran            atomic.Bool
}

// New returns a worker. logger may be nil (no logs); reg may be nil (no
// metrics exported). The retry backoff is the store's (task.Config.Backoff).
func New(cfg Config, store *task.Store, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Worker, error) {
	cfg = cfg.WithDefaults()
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
	log := logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer)
	scfg := stream.Config{Stream: cfg.Stream, Group: cfg.Group, Consumer: cfg.Consumer, Block: cfg.Block, Count: cfg.ReadCount}
	group, err := stream.NewGroup(scfg, rdb)
	if err != nil {
		return nil, err
	}
	dlqw, err := dlq.NewWriter(dlq.Config{Stream: cfg.Stream, Group: cfg.Group, DLQ: cfg.DLQ}, rdb)
	if err != nil {
		return nil, err
	}
	met, err := newMetrics(reg, group, cfg.ReclaimIdle, log)
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, handlers: &registry{byKind: map[string]Handler{}}, log: log}
	tr := &redisTransport{group: group, dlq: dlqw, reclaimIdle: cfg.ReclaimIdle}
	w.proc = newProcessor(cfg, processorDeps{store: store, tr: tr, log: log, met: met, handlers: w.handlers})
	consumer, err := stream.NewConsumer(scfg, rdb, w.proc, logger)
	if err != nil {
		return nil, err
	}
	w.consume, w.stream = consumer.Run, consumer
	return w, nil
}

// Config returns the configuration with defaults filled in.
func (w *Worker) Config() Config { return w.cfg }

// Handle registers h for tasks of kind, replacing an earlier one. A task of
// a kind without a handler fails (and is retried: a later deploy may
// register it). It panics on an empty kind or a nil handler.
func (w *Worker) Handle(kind string, h Handler) { w.HandleWith(kind, h, HandlerOptions{}) }

// HandleWith is Handle with options for the kind. It panics on an empty
// kind, a nil handler or invalid options.
func (w *Worker) HandleWith(kind string, h Handler, opts HandlerOptions) {
	if kind == "" || h == nil {
		panic("ingest: Handle needs a kind and a handler")
	}
	if err := opts.Validate(); err != nil {
		panic("ingest: HandleWith(" + strconv.Quote(kind) + "): " + err.Error())
	}
	w.handlers.set(kind, h)
	w.handlers.setOptions(kind, opts)
}

// HandleDefault registers h for every kind without a handler of its own
// (the binary's webhook handler serves all kinds this way). It panics on a
// nil handler.
func (w *Worker) HandleDefault(h Handler) {
	if h == nil {
		panic("ingest: HandleDefault needs a handler")
	}
	w.handlers.set("", h)
}

// registry maps task kinds to handlers; handlers may be registered while
// the worker runs.
type registry struct {
	mu       sync.RWMutex
	byKind   map[string]Handler
	fallback Handler // for kinds without a handler; nil: none
	options  map[string]HandlerOptions
}

// setOptions sets the options of kind.
func (r *registry) setOptions(kind string, opts HandlerOptions) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.options == nil {
		r.options = map[string]HandlerOptions{}
	}
	r.options[kind] = opts
}

// optionsOf returns the options of kind (zero when none were set).
func (r *registry) optionsOf(kind string) HandlerOptions {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.options[kind]
}

// set registers h for kind, or as the fallback when kind is "".
func (r *registry) set(kind string, h Handler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kind == "" {
		r.fallback = h
		return
	}
	r.byKind[kind] = h
}

// lookup returns the handler of kind, the fallback, or nil.
func (r *registry) lookup(kind string) Handler {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if h, ok := r.byKind[kind]; ok {
		return h
	}
	return r.fallback
}

// Sink returns the processing path, for the reclaimer to feed claimed
// entries into: they are handled exactly like fresh deliveries.
func (w *Worker) Sink() stream.Sink { return w.proc }

// Run consumes tasks until ctx is cancelled, then shuts down gracefully and
// returns nil. It may be called once.
//
// Shutdown: the consumer stops reading (within Config.Block), then the
// processing path shuts down in order: running handlers get
// Config.ShutdownTimeout to finish, the rest are cancelled and handed back,
// the last outcomes are recorded, and I/O stops (see processor.shutdown).
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("ingest: Worker.Run may be called only once")
	}
	w.proc.launch(hook.OnSucceeded(ctx))
	w.log.Info("worker started", "concurrency", w.cfg.Concurrency)
	_ = w.consume(ctx)
	w.proc.shutdown()
	if w.closeTransport != nil {
		w.closeTransport()
	}
	w.log.Info("worker stopped")
	return nil
}
