package ingest

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/stream"
)

// transport settles the messages that carried tasks to the processor: the
// Redis stream (redisTransport) or Kafka (kafkaTransport). The processor
// decides what happens to each message only after the task's state has
// committed in Postgres; the transport carries the decision out:
//
//   - acknowledged: the message is done (XACK; the record's offset may be
//     committed);
//   - deferred: the task must be looked at again at a time (a retry, a task
//     not yet due, one under another live lease, one handed back);
//   - dead-lettered: a DLQ message is written, then the message is done;
//   - touched: a message still being handled is kept from redelivery;
//   - parked: a message delivered during shutdown is handed back;
//   - abandoned: the message of a run this worker gave up (its handler
//     ignores its timeout) is left for another worker to take the task
//     over once its lease has expired.
//
// A method that fails leaves its messages to be delivered again later
// (never lost); a duplicate delivery is harmless (package task guards every
// start).
type transport interface {
	settle(ctx context.Context, acks []string, later []deferral) error
	// deadLetter writes e (e.SourceID the message) to the DLQ and
	// acknowledges the message, atomically or in that order; written
	// reports whether a DLQ message was written (not when the DLQ is off
	// or the death was written before).
	deadLetter(ctx context.Context, e dlq.Entry) (written bool, err error)
	touch(ctx context.Context, ids []string) error
	park(ctx context.Context, ids []string) error
	abandon(ctx context.Context, ids []string) error
}

// deferral asks for a message's task to be delivered again at a time.
type deferral struct {
	id     string
	taskID uuid.UUID
	at     time.Time
	// unrecorded: the task's state could not be read (Postgres
	// unreachable); the message must come back without Postgres' help.
	unrecorded bool
}

// redisTransport settles stream entries of the consumer group. A deferred
// entry stays pending with an idle time that makes the reclaimer claim it
// at its time (docs/ARCHITECTURE.md §2.5).
type redisTransport struct {
	group       *stream.Group
	dlq         *dlq.Writer
	reclaimIdle time.Duration
}

func (t *redisTransport) settle(ctx context.Context, acks []string, later []deferral) error {
	now := time.Now()
	idles := make([]stream.Idle, len(later))
	for i, d := range later {
		idles[i] = stream.Idle{ID: d.id, Idle: t.idleUntil(d.at, now)}
	}
	return t.group.Apply(ctx, acks, idles)
}

// idleUntil returns the idle time that makes an entry claimable by the
// reclaimer (min-idle reclaimIdle) at at: reclaimIdle - (at - now), clamped
// to [0, reclaimIdle].
func (t *redisTransport) idleUntil(at, now time.Time) time.Duration {
	return max(0, min(t.reclaimIdle-at.Sub(now), t.reclaimIdle))
}

func (t *redisTransport) deadLetter(ctx context.Context, e dlq.Entry) (bool, error) {
	id, err := t.dlq.Write(ctx, e)
	return id != "", err
}

func (t *redisTransport) touch(ctx context.Context, ids []string) error {
	return t.group.Touch(ctx, ids...)
}

// park makes entries claimable at once by another worker.
func (t *redisTransport) park(ctx context.Context, ids []string) error {
	return t.group.SetIdle(ctx, t.reclaimIdle, ids...)
}

// abandon hands entries to this consumer's stream.AbandonedConsumer: silent
// from now on, so other workers' reclaimers take their tasks over once
// the leases expire (package reclaim), while this worker's reclaimer takes
// them only after the reclaim idle time, and leaves them alone anyway
// while they are in flight here.
func (t *redisTransport) abandon(ctx context.Context, ids []string) error {
	return t.group.Abandon(ctx, ids...)
}
