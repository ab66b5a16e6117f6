package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// Kafka returns the queue of Kafka mode: tasks travel through kcfg.Topic,
// read by the consumer group kcfg.Group, and are run exactly as in Redis
// mode (the same start guard, handlers, completion, audit trail and
// metrics); only the settling of messages differs (see kafkaTransport).
// The outbox relay publishes to the topic (kafka.Publisher) and the task
// store publishes through it. The reclaimer, the rescuer and the
// idle-consumer cleanup do not exist in this mode: a record is committed
// only once its task's outcome, or the outbox row that brings the task
// back, has committed, so there is nothing for them to recover (an outbox
// row that went DEAD is redriven: task.Store.Redrive); retention deletes
// old outbox rows without trimming anything. Config.Stream, Group and DLQ
// must be left zero: the topic, group and DLQ topic are kcfg's. opts are
// extra franz-go client options (tests).
func Kafka(kcfg kafka.Config, opts ...kgo.Opt) Queue { return &kafkaQueue{kcfg: kcfg, opts: opts} }

// kafkaQueue is the queue of Kafka mode.
type kafkaQueue struct {
	kcfg kafka.Config
	opts []kgo.Opt
}

func (q *kafkaQueue) bind(cfg Config) (Config, error) {
	if err := q.kcfg.Validate(); err != nil {
		return cfg, configError("Kafka", "%w", err)
	}
	q.kcfg = q.kcfg.WithDefaults()
	for setting, v := range map[string]string{"Config.Stream": cfg.Stream, "Config.Group": cfg.Group, "Config.DLQ": cfg.DLQ} {
		if v != "" {
			return cfg, configError(setting, "must be left zero in Kafka mode (the topic, group and DLQ topic are kafka.Config's), got %q", v)
		}
	}
	cfg.Stream, cfg.Group, cfg.NoDLQ = q.kcfg.Topic, q.kcfg.Group, true
	cfg.ReclaimDisabled = true
	m := &cfg.Maintenance
	m.RescuerDisabled, m.ConsumersDisabled = true, true
	m.Retention.DisableTrim = true // the topic keeps its records to Kafka's retention
	return cfg, nil
}

func (q *kafkaQueue) publisher(cfg Config) (outbox.Publisher, func(), error) {
	pcfg := q.kcfg
	pcfg.ClientID = cfg.Consumer + "-relay"
	cl, err := kafka.NewProducerClient(pcfg, q.opts...)
	if err != nil {
		return nil, nil, err
	}
	return kafka.NewPublisher(cl, q.kcfg.ProduceTimeout), cl.Close, nil
}

func (q *kafkaQueue) redis() redis.UniversalClient { return nil }

// newWorker builds the consumer feeding the processor and the transport
// settling its records; pool is where deferred tasks get their outbox
// rows.
func (q *kafkaQueue) newWorker(cfg Config, store *task.Store, pool *pgxpool.Pool, logger *slog.Logger, reg prometheus.Registerer) (*worker, error) {
	kcfg := q.kcfg
	if kcfg.ClientID == "" {
		kcfg.ClientID = cfg.Consumer
	}
	log := logger.With("topic", kcfg.Topic, "group", kcfg.Group, "consumer", cfg.Consumer)
	tr := &kafkaTransport{db: pool, topic: kcfg.Topic, dlqTopic: kcfg.DLQTopic,
		timeout: kcfg.ProduceTimeout, redelay: kcfg.RedeliverDelay}
	w, err := newWorkerWith(cfg, store, tr, log, reg)
	if err != nil {
		return nil, err
	}
	c, err := kafka.NewConsumer(kcfg, kafkaSink{w.proc}, log, q.opts...)
	if err != nil {
		return nil, err
	}
	tr.consumer = c
	w.consume, w.closeConsumer = c.Run, c.Close
	w.ping = func(ctx context.Context) error {
		if err := c.Client().Ping(ctx); err != nil {
			return fmt.Errorf("kafka brokers %v: %w", kcfg.Brokers, err)
		}
		return nil
	}
	return w, nil
}

// attach has nothing to add: Kafka mode runs no reclaimer.
func (q *kafkaQueue) attach(*Service, *pgxpool.Pool, *slog.Logger, prometheus.Registerer) error {
	return nil
}

// kafkaSink adapts the processor to kafka.Sink.
type kafkaSink struct{ *processor }

// Process implements kafka.Sink (see processor.process).
func (s kafkaSink) Process(ctx context.Context, ds []kafka.Delivery, reserved int) {
	now := time.Now()
	out := make([]delivery, len(ds))
	for i, d := range ds {
		out[i] = delivery{id: d.ID, taskID: d.Value.TaskID, kind: d.Value.Kind, traceparent: d.Value.Traceparent, err: d.Err,
			rawTaskID: d.RawTaskID, received: now}
	}
	s.process(ctx, out, reserved)
}

// kafkaTransport settles task records (Kafka mode). A record is settled,
// letting its partition's offset move past it, only once its outcome has
// committed in Postgres; a record cannot be left "pending" as a stream
// entry can, so a deferred task gets a new outbox row due at its time
// (outbox.InsertDue) and its record is settled once that row has committed:
// the relay publishes the task again when it falls due. Nothing waits in
// the consumer.
//
// A task RUNNING under another worker's live lease (a record delivered
// again after a rebalance while its first run goes on elsewhere) is
// deferred the same way, to the end of that lease: if that worker finishes,
// the new record finds the task finished; if it died, the new record takes
// the task over. Settling the duplicate without that row would lose the
// task if the other worker died, since its own record may already be
// committed by the partition's new owner.
//
// When Postgres cannot be reached (the deferral's row cannot be written,
// or the start itself failed), the record is handed back to the processor
// after kafka.Config.RedeliverDelay, holding its offset meanwhile.
type kafkaTransport struct {
	consumer *kafka.Consumer
	db       outbox.Execer
	topic    string
	dlqTopic string
	timeout  time.Duration
	redelay  time.Duration
}

func (t *kafkaTransport) settle(ctx context.Context, acks []string, later []deferral) error {
	t.consumer.Settle(acks...)
	var ids []uuid.UUID
	var ats []*time.Time
	var recorded, unrecorded []string
	for _, d := range later {
		if d.unrecorded {
			unrecorded = append(unrecorded, d.id)
			continue
		}
		at := d.at
		ids, ats, recorded = append(ids, d.taskID), append(ats, &at), append(recorded, d.id)
	}
	t.consumer.Redeliver(t.redelay, unrecorded...)
	if len(ids) == 0 {
		return nil
	}
	if err := outbox.InsertDue(ctx, t.db, t.topic, ids, ats); err != nil {
		t.consumer.Redeliver(t.redelay, recorded...)
		return err
	}
	t.consumer.Settle(recorded...)
	return nil
}

// deadLetter produces the DLQ record, then settles the task record. A
// crash in between writes the DLQ record again on redelivery: the DLQ topic
// is at-least-once.
func (t *kafkaTransport) deadLetter(ctx context.Context, e dlq.Entry) (bool, error) {
	if t.dlqTopic != "" {
		ctx, cancel := context.WithTimeout(ctx, t.timeout)
		defer cancel()
		if err := t.consumer.Client().ProduceSync(ctx, kafka.DeadLetterRecord(t.dlqTopic, e)).FirstErr(); err != nil {
			return false, fmt.Errorf("produce to %s: %w", t.dlqTopic, err)
		}
	}
	t.consumer.Settle(e.SourceID)
	return t.dlqTopic != "", nil
}

// touch has nothing to do: a record is never redelivered to a live member
// of the group while its partition stays assigned.
// redelivers: a record whose start a crash undid would wait, uncommitted,
// for the next rebalance.
func (t *kafkaTransport) redelivers() bool { return false }

func (t *kafkaTransport) touch(context.Context, []string) error { return nil }

// handBack leaves records delivered during shutdown unsettled: the
// partition's next owner reads them again from the last committed offset.
func (t *kafkaTransport) handBack(context.Context, []string) error { return nil }

// abandon has nothing to do and nothing it could do: a record stays with
// this live member, whose partition is not reassigned, so an abandoned
// run's task is not taken over in Kafka mode until its handler returns.
func (t *kafkaTransport) abandon(context.Context, []string) error { return nil }
