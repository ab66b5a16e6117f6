package ingest

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Worker is the engine of a Service without the service around it (no
// reclaimer, relay or maintainer), for the tests of this package.
type Worker = worker

// New returns a Redis-mode worker on store.
func New(cfg Config, store *task.Store, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Worker, error) {
	return newBareWorker(Redis(rdb), cfg, store, nil, logger, reg)
}

// NewKafka returns a Kafka-mode worker on store; pool is where deferred
// tasks get their outbox rows.
func NewKafka(cfg Config, kcfg kafka.Config, store *task.Store, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer, opts ...kgo.Opt) (*Worker, error) {
	return newBareWorker(Kafka(kcfg, opts...), cfg, store, pool, logger, reg)
}

func newBareWorker(q Queue, cfg Config, store *task.Store, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*worker, error) {
	cfg, logger, err := prepare(q, cfg, logger)
	if err != nil {
		return nil, err
	}
	return q.newWorker(cfg, store, pool, logger, reg)
}

func (w *worker) Config() Config { return w.cfg }
func (w *worker) Handle(kind string, h Handler) {
	w.handlers.handle(kind, h.fn(), HandlerOptions{})
}
func (w *worker) HandleDefault(h Handler)       { w.handlers.handleDefault(h.fn()) }
func (w *worker) Run(ctx context.Context) error { return w.run(ctx) }
func (w *worker) Sink() stream.Sink             { return redisSink{w.proc} }
func (w *worker) HandleWith(kind string, h Handler, opts HandlerOptions) {
	w.handlers.handle(kind, h.fn(), opts)
}
func (w *worker) HandleResult(kind string, h ResultHandler) {
	w.handlers.handle(kind, h.fn(), HandlerOptions{})
}

// BeforeRecord makes w's completer call f before each store call that
// records outcomes (op: succeed, fail or release); call it before Run.
func (w *worker) BeforeRecord(f func(op string)) { w.proc.completer.beforeRecord = f }

// SkipBeats makes w's heartbeat skip its beats while skip reports true;
// call it before Run.
func (w *worker) SkipBeats(skip func() bool) { w.proc.heartbeater.skipBeat = skip }

// FreeSlots returns the number of w's free handler slots.
func (w *worker) FreeSlots() int { return w.proc.inflight.freeCount() }

// HandleBatch is Service.HandleBatch on a bare worker.
func (w *worker) HandleBatch(kind string, fn BatchHandler, opts BatchOptions) error {
	return w.handleBatch(kind, fn, opts)
}
