package ingest

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/task"
)

// NewKafka returns a worker of Kafka queue mode: it consumes kcfg.Topic as
// a member of kcfg.Group and runs tasks exactly as New's worker does (the
// same start guard, handlers, completion, audit trail and metrics); only
// the settling of messages differs (see kafkaTransport). cfg's Stream,
// Group, DLQ and ReclaimIdle do not apply. pool is where deferred tasks get
// their outbox rows. opts are extra franz-go client options (tests).
func NewKafka(cfg Config, kcfg kafka.Config, store *task.Store, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer, opts ...kgo.Opt) (*Worker, error) {
	if err := kcfg.Validate(); err != nil {
		return nil, err
	}
	kcfg = kcfg.WithDefaults()
	cfg.Stream, cfg.Group, cfg.NoDLQ = kcfg.Topic, kcfg.Group, kcfg.DLQTopic == ""
	cfg = cfg.WithDefaults()
	cfg.DLQ = kcfg.DLQTopic
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("worker config: %w", err)
	}
	if store == nil || pool == nil {
		return nil, errors.New("worker: a task store and a Postgres pool are required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if kcfg.ClientID == "" {
		kcfg.ClientID = cfg.Consumer
	}
	log := logger.With("topic", kcfg.Topic, "group", kcfg.Group, "consumer", cfg.Consumer)
	met, err := newMetrics(reg, nil, 0, log)
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, handlers: &registry{byKind: map[string]Handler{}}, log: log}
	proc, c, err := newKafkaWorker(cfg, kcfg, store, pool, processorDeps{log: log, met: met, handlers: w.handlers}, opts...)
	if err != nil {
		return nil, err
	}
	w.proc, w.consume, w.closeTransport, w.kafka = proc, c.Run, c.Close, c
	return w, nil
}

// KafkaConsumer returns the Kafka consumer of a worker made by NewKafka
// (nil otherwise), for lag queries.
func (w *Worker) KafkaConsumer() *kafka.Consumer { return w.kafka }
