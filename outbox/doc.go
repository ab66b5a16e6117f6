// Package outbox owns outbox_event: the transactional handover of tasks from
// Postgres to the Redis task stream.
//
// Insert writes an event in the caller's transaction (task creation, redrive,
// rescue); a statement-level trigger NOTIFYs relays on commit, never for a
// rolled-back transaction. The relay publishes due events with XADD and marks
// them SENT; delivery to the stream is at-least-once (a duplicate entry is
// harmless because starting a task is a guarded transition).
package outbox
