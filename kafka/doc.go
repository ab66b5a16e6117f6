// Package kafka is the Kafka transport of Kafka queue mode
// (docs/ARCHITECTURE.md §1, INGEST_QUEUE=kafka): it carries tasks from the
// outbox to the workers as Redis Streams do in the default mode. Postgres
// stays the truth; a record only says "look at task X".
//
// It owns the record format (Value: key = task id, value = JSON
// {"task_id","kind"}; DLQ records carry the JSON of a dlq.Entry), the
// Publisher the outbox relay publishes through (ProduceSync bounded by a
// timeout, so an unreachable broker fails the attempt), and the Consumer:
// a consumer-group member that hands records to a Sink and commits a
// partition's offset only up to its lowest record not yet settled. A
// record is settled (Consumer.Settle) once its outcome has committed in
// Postgres; a record whose outcome could not be recorded is handed to the
// Sink again (Consumer.Redeliver). Records of a partition revoked or lost
// in a rebalance, or of a consumer that died, are delivered again to the
// partition's next owner from the last committed offset: delivery is
// at-least-once and duplicates are harmless because starting a task is a
// guarded transition (package task).
package kafka
