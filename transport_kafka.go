package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

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
func (t *kafkaTransport) touch(context.Context, []string) error { return nil }

// park leaves records delivered during shutdown unsettled: the partition's
// next owner reads them again from the last committed offset.
func (t *kafkaTransport) park(context.Context, []string) error { return nil }

// abandon has nothing to do and nothing it could do: a record stays with
// this live member, whose partition is not reassigned, so an abandoned
// run's task is not taken over in Kafka mode until its handler returns.
func (t *kafkaTransport) abandon(context.Context, []string) error { return nil }

// kafkaSink adapts the processor to kafka.Sink.
type kafkaSink struct{ p *processor }

func (s kafkaSink) Reserve(n int) int          { return s.p.Reserve(n) }
func (s kafkaSink) SlotFreed() <-chan struct{} { return s.p.SlotFreed() }

func (s kafkaSink) Process(ctx context.Context, ds []kafka.Delivery, reserved int) {
	now := time.Now()
	out := make([]delivery, len(ds))
	for i, d := range ds {
		out[i] = delivery{id: d.ID, taskID: d.Value.TaskID, kind: d.Value.Kind, traceparent: d.Value.Traceparent, err: d.Err,
			rawTaskID: d.RawTaskID, received: now}
	}
	s.p.process(ctx, out, reserved)
}

// kafkaWorker builds the Kafka-mode parts of a worker: the consumer
// feeding w.proc and the transport settling its records.
func newKafkaWorker(cfg Config, kcfg kafka.Config, store *task.Store, db outbox.Execer, deps processorDeps, opts ...kgo.Opt) (*processor, *kafka.Consumer, error) {
	tr := &kafkaTransport{db: db, topic: kcfg.Topic, dlqTopic: kcfg.DLQTopic,
		timeout: kcfg.ProduceTimeout, redelay: kcfg.RedeliverDelay}
	deps.tr = tr
	deps.store = store
	p := newProcessor(cfg, deps)
	c, err := kafka.NewConsumer(kcfg, kafkaSink{p}, deps.log, opts...)
	if err != nil {
		return nil, nil, err
	}
	tr.consumer = c
	return p, c, nil
}
