// Package dlq owns the dead-letter stream (docs/ARCHITECTURE.md §4.3, §4.4): writing entries,
// listing them, and replaying them.
//
// Writer moves a task-stream entry to the DLQ with one Lua script that
// XADDs the DLQ entry and XACKs the source entry atomically: if the XADD
// fails (a wrong key type, out of memory) nothing is acknowledged and the
// source entry stays pending, never lost. The script writes only while the
// source entry is pending, so a retried write adds no second entry; and with
// Entry.Death set it keeps a marker key per death (task id and time of
// death, next to the DLQ key, expiring after MarkerTTL), so other entries of
// the same task that carry the same death are only acknowledged: one DLQ
// entry per death. With no DLQ key configured the writer only acknowledges
// (DEAD state only).
//
// DLQ entry fields (contract): task_id, kind, attempt_count, last_error,
// source_id (the task-stream entry id), dead_at (RFC 3339).
//
// Every operator's delete of tasks goes through Delete too, which removes
// the deleted tasks' DLQ entries, and their entries in the task stream
// (stream.Forget), after the commit.
//
// Every redrive goes through this package, so that a redriven task never
// keeps the entry of its old death and the DLQ's depth stays the number of
// DEAD tasks with an entry: Redrive (task ids), RedriveMatching (a filter,
// or the ids a dry run listed) and Replay (entries).
//
// Replay sends a DEAD task back to QUEUED through the task store (Redrive,
// which writes a new outbox event in the same transaction) and removes its
// DLQ entry (XDEL) only after that commit. An entry without a valid task_id
// (a poison message) cannot be replayed through the store: Replay reports
// it and keeps it.
package dlq
