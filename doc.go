// Package ingest runs ingest tasks reliably: Postgres holds the truth about
// every task, a Redis Stream consumer group carries tasks to a pool of
// workers.
//
// It wires the packages of this module into one Service (task store, queue
// consumer, reclaimer, DLQ, outbox relay, rescuer and retention), built by
// NewService on a Queue (Redis or Kafka) from one Config, and defines the
// Go API library users see: Handler, ResultHandler (a handler that
// returns a result; Returning), BatchHandler (tasks of a kind in batches,
// an Outcome per task; Service.HandleBatch), Task (with ReportProgress),
// Permanent, RetryAfter and Service.Wait. docs/ARCHITECTURE.md describes
// the whole path, docs/PIPELINES.md results, progress, waiting and batch
// handlers.
//
// It owns the worker engine: the processor (processor.go: start, dispatch,
// execute, shutdown) and its parts, each owning its state: the in-flight
// set (inflight.go; its message slots and their reservation by readers
// and reclaim rounds, slots.go), per-kind admission (kinds.go), the completer
// (completer.go) and the heartbeater with its cancel listener
// (heartbeat.go, cancel.go), the progress writer of each run
// (progress.go), the batcher that gathers runs into a batch handler's
// batches (batch.go: each task keeps its own run), and each queue mode's consumer, transport and
// gauges (queue_redis.go, queue_kafka.go).
//
// # The worker's contract
//
// Delivery is at-least-once: a handler may run more than once for one task
// (a worker died after the side effect, or lost its lease), so handlers must
// be idempotent, keyed by Task.ID. Starting a task is a guarded transition
// (docs/ARCHITECTURE.md §2), so a duplicate delivery of a task that is running elsewhere
// or finished does not run it again.
//
// The worker, never the handler, acknowledges stream entries, and only after
// the outcome is committed in Postgres:
//
//   - success: SUCCEEDED, then XACK;
//   - failure with attempts left: RETRYING; the entry stays pending, its
//     idle time set so the reclaimer claims it when the retry falls due;
//   - failure with attempts exhausted, or Permanent: DEAD, then the DLQ entry
//     and the XACK in one Lua script (XACK only without a DLQ);
//   - an entry without a valid task_id, or of an unknown task: DLQ + XACK;
//   - a handler cut off by shutdown: the task is released (RETRYING, due
//     now, no failure counted) and its entry made claimable at once.
//
// While a handler runs, and after it has returned until its outcome is
// recorded, a heartbeat renews its lease and keeps its entry's idle time
// low, so a task running far longer than the reclaim idle time is not
// claimed by another worker. A completion whose guard no longer matches
// (the lease was lost) changes nothing; it is logged and counted as
// result="conflict".
//
// # Kafka mode
//
// NewService with the Kafka queue runs the same processing path on a Kafka
// consumer group (package kafka) instead of the stream: the same start
// guard, handlers, completion, audit trail and metrics. Only the settling
// of messages differs (queue_kafka.go): a record's offset is committed only
// after its outcome has committed in Postgres; a retry, a task not yet due
// or one under another worker's live lease gets an outbox row due at its
// time and the relay publishes it again then; DEAD writes a record to the
// DLQ topic before the commit.
package ingest
