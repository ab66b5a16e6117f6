// Package transition owns the audit trail of task state changes: the
// ingest_task_transition row type, inserting rows inside the caller's
// transaction (the one that changes the task's status, so a change and its
// audit row commit or roll back together), and listing a task's history.
//
// States are plain strings here ("" for the from-state of a task's creation);
// package task owns their meaning and the allowed transitions.
package transition
