package ingest

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/hook"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// Queue carries tasks from the task store to the workers: Redis (a stream
// and its consumer group) or Kafka (a topic and its consumer group).
// NewService takes one; each mode's parts (consumer, transport, sink,
// publisher, gauges and the maintenance services it needs) live in one
// file of this package (queue_redis.go, queue_kafka.go). A Queue serves
// one Service.
type Queue interface {
	// bind returns cfg with the queue's identity set (Kafka: the topic
	// and group) and the components the mode does not run disabled.
	bind(cfg Config) (Config, error)
	// publisher returns what the outbox relay publishes through, and a
	// func that closes it (nil: nothing to close).
	publisher(cfg Config) (outbox.Publisher, func(), error)
	// redis returns the Redis client of the maintainer (nil: none).
	redis() redis.UniversalClient
	// newWorker builds the worker: the consumer feeding the processor and
	// the transport settling its messages, and the mode's gauges.
	newWorker(cfg Config, store *task.Store, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*worker, error)
	// attach builds the mode's services around a built service (Redis:
	// the reclaimer, and the reports of lost data to the leader).
	attach(s *Service, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) error
}

// worker is the engine of a Service: a consumer of the queue feeding the
// processor, and the handlers it runs.
type worker struct {
	cfg  Config
	proc *processor
	// consume reads messages into proc until its context is cancelled;
	// closeConsumer, when set, runs once proc has shut down (Kafka: the
	// last commit). ping checks the queue's servers.
	consume       func(context.Context) error
	closeConsumer func()
	ping          func(context.Context) error
	handlers      *registry
	log           *slog.Logger
	ran           atomic.Bool
}

// newWorkerWith returns a worker of cfg (defaults filled in) whose
// processor settles its messages through tr; the caller sets its consumer.
func newWorkerWith(cfg Config, store *task.Store, tr transport, log *slog.Logger, reg prometheus.Registerer) (*worker, error) {
	if store == nil {
		return nil, errors.New("ingest: nil task store")
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	met, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	w := &worker{cfg: cfg, handlers: newRegistry(), log: log}
	w.proc = newProcessor(cfg, processorDeps{store: store, tr: tr, log: log, met: met, handlers: w.handlers})
	return w, nil
}

// run consumes tasks until ctx is cancelled, then shuts down gracefully and
// returns nil. It may be called once.
//
// Shutdown: the consumer stops reading (within Config.Block), then the
// processing path shuts down in order: running handlers get
// Config.ShutdownTimeout to finish, the rest are cancelled and handed back,
// the last outcomes are recorded, and I/O stops (see processor.shutdown).
func (w *worker) run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return errors.New("ingest: the worker may run only once")
	}
	w.proc.launch(hook.OnSucceeded(ctx))
	w.log.Info("worker started", "concurrency", w.cfg.Concurrency)
	_ = w.consume(ctx)
	w.proc.shutdown()
	if w.closeConsumer != nil {
		w.closeConsumer()
	}
	w.log.Info("worker stopped")
	return nil
}
