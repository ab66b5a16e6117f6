// Package transition owns the audit trail of task state changes: the
// ingest_task_transition row type, inserting rows inside the caller's
// transaction (the one that changes the task's status, so a change and its
// audit row commit or roll back together), and listing a task's history.
//
// Insert serves the changes package task makes with a pgx.Tx of its own
// (creation, redrive). The hot transitions (start, succeed, fail, release)
// write the same columns from an INSERT inside their own single statement
// (task/transitions.go), so that change and audit row stay one round trip;
// see docs/ARCHITECTURE.md §2.2.
//
// The table is partitioned by RANGE (created_at) (migration 00024):
// partitions.go has the steps the leader's upkeep (package maintenance)
// takes: list the partitions, create them ahead (Extend), and drop a past
// one (DropPartition) once no transaction can still write to it
// (OpenBefore) and no task that still exists has a row in it (Blocker).
//
// States are plain strings here ("" for the from-state of a task's creation);
// package task owns their meaning and the allowed transitions.
package transition
