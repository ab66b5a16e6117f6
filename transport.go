package ingest

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/dlq"
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
//   - handed back: a message delivered during shutdown is left for
//     another worker;
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
	handBack(ctx context.Context, ids []string) error
	abandon(ctx context.Context, ids []string) error
	// redelivers reports whether a message that is neither settled nor
	// touched is delivered again by the queue itself: then a start that a
	// crash of PostgreSQL undid need not have been durable, since its
	// message brings the task back (task.Store.StartUnflushed,
	// docs/ARCHITECTURE.md §2.4).
	redelivers() bool
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
