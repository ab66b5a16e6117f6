package ingest

import (
	"cmp"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// NewKafkaService builds the service of Kafka queue mode: a Kafka-mode
// worker (NewKafka), an outbox relay publishing to Kafka (kafka.Publisher)
// through which the service's task store (Service.Store) publishes, and a
// maintainer running only outbox retention without stream trimming (old
// SENT rows deleted) and the periodic schedules while this process leads. cfg.Store, cfg.Worker,
// cfg.Relay and cfg.Maintenance.Elector and .Retention apply as in
// NewService (Store.Stream defaults to the topic, and must be it); the
// reclaimer and the rescuer do not exist in this mode: a record is
// committed only once its task's outcome, or the outbox row that brings the
// task back, has committed, so there is nothing for them to recover (an
// outbox row that went DEAD is redriven: task.Store.Redrive). opts are
// extra franz-go client options (tests).
func NewKafkaService(cfg ServiceConfig, kcfg kafka.Config, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer, opts ...kgo.Opt) (*Service, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := kcfg.Validate(); err != nil {
		return nil, err
	}
	kcfg = kcfg.WithDefaults()
	cfg.Store.Stream = cmp.Or(cfg.Store.Stream, kcfg.Topic)
	if cfg.Store.Stream != kcfg.Topic {
		return nil, fmt.Errorf("ingest: ServiceConfig.Store.Stream is %q but the worker consumes topic %q: leave it zero", cfg.Store.Stream, kcfg.Topic)
	}
	cfg.Store.Listen = cmp.Or(cfg.Store.Listen, cfg.Listen)
	cfg.Relay.Listen = cmp.Or(cfg.Relay.Listen, cfg.Listen)
	svc := &Service{log: logger}
	var storeOpts []task.Option
	consumer := cfg.Worker.WithDefaults().Consumer
	if !cfg.RelayDisabled {
		rc := cfg.Relay
		rc.ID = cmp.Or(rc.ID, consumer)
		pcfg := kcfg
		pcfg.ClientID = consumer + "-relay"
		cl, err := kafka.NewProducerClient(pcfg, opts...)
		if err != nil {
			return nil, err
		}
		if svc.relay, err = outbox.NewRelayWith(rc, pool, kafka.NewPublisher(cl, kcfg.ProduceTimeout), logger, reg); err != nil {
			cl.Close()
			return nil, err
		}
		svc.closers = append(svc.closers, cl.Close)
		storeOpts = append(storeOpts, task.PublishWith(outbox.NewWriter(svc.relay, outbox.PublishClaimed)))
	}
	var err error
	if svc.store, err = task.NewStore(cfg.Store, pool, storeOpts...); err != nil {
		svc.close()
		return nil, fmt.Errorf("task store config: %w", err)
	}
	cfg.Worker.Consumer = consumer
	if svc.worker, err = NewKafka(cfg.Worker, kcfg, svc.store, pool, logger, reg, opts...); err != nil {
		svc.close()
		return nil, err
	}
	mc := maintenance.Config{
		Elector:           cfg.Maintenance.Elector,
		Retention:         cfg.Maintenance.Retention,
		RetentionDisabled: cfg.Maintenance.RetentionDisabled,
		Periodic:          cfg.Maintenance.Periodic,
		RescuerDisabled:   true,
		ConsumersDisabled: true,
	}
	mc.Elector.ID = cmp.Or(mc.Elector.ID, consumer)
	mc.Retention.Streams, mc.Retention.DisableTrim = []string{kcfg.Topic}, true
	mc.Retention.DLQ = "" // the DLQ is a topic: its records stay to Kafka's retention
	if svc.maintainer, err = maintenance.New(mc, pool, nil, logger, reg, maintenance.CreateWith(svc.store)); err != nil {
		svc.close()
		return nil, err
	}
	return svc, nil
}
