// Package outbox owns outbox_event: the transactional handover of tasks from
// Postgres to the Redis task stream, and keeping the two consistent.
//
// Insert writes an event in the caller's transaction (task creation, redrive,
// rescue); a statement-level trigger NOTIFYs relays on commit (channel
// NotifyChannel), never for a rolled-back transaction.
//
// Relay publishes events. Any number of relays may run at once: a pass
// claims a batch of due rows (NEW or RETRYING, next_retry_at come, no live
// claim) with FOR UPDATE SKIP LOCKED, setting claimed_by/claimed_until (a
// lease); XADDs one entry {task_id, kind} per row to the row's stream in one
// pipelined round trip; and marks each row SENT (stream_id, sent_at), or on
// a failed XADD RETRYING with capped exponential backoff, DEAD after
// MaxAttempts. Every update is guarded in SQL by the claim, so a relay that
// stalled past its lease changes nothing. A relay never loses a row: any
// failure leaves it NEW/RETRYING or claimed under a lease that expires.
// Relays wake on NOTIFY within milliseconds of a commit and poll as a
// fallback.
//
// Delivery to the stream is at-least-once: a relay that stalls past its
// lease, or fails after its XADD, causes the row to be published again. A
// duplicate entry is harmless because starting a task is a guarded
// transition (package task).
//
// Rescuer republishes tasks that should be in Redis but are not (trimmed,
// deleted, or lost with Redis data): it gives each a new outbox row. Tasks
// whose outbox row went DEAD are left to an operator.
//
// Retention deletes old SENT rows (DEAD rows stay for forensics) and trims
// the task stream, never past an entry that is pending or not yet delivered
// to any consumer group.
//
// Metrics (DESIGN §6): outbox_backlog, outbox_backlog_age_seconds,
// outbox_publish_total{result}, outbox_publish_seconds{result},
// outbox_publish_delay_seconds; and outbox_rescued_total,
// outbox_retention_deleted_total, outbox_stream_trimmed_total{stream},
// outbox_maintenance_errors_total{component}.
//
// The consumer group must be created at id 0 (XGROUP CREATE ... 0 MKSTREAM)
// when it is missing: entries the relay added before the group existed
// would otherwise never be delivered (the rescuer would republish them only
// after its grace period).
package outbox
