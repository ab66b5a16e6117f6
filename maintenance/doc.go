// Package maintenance owns the singleton services, those that one process
// at a time should run for a whole deployment, and the leader election
// that picks that process.
//
// Services:
//   - the rescuer gives a new outbox row to each task that should be in
//     Redis but is not (its entry trimmed, deleted, or lost with Redis
//     data): due QUEUED or RETRYING tasks, and RUNNING ones whose lease
//     expired, whose latest entry is gone or was delivered and is no longer
//     pending. Which task is a candidate is task state, so that SQL lives in
//     package task (task.RescueCandidates, task.Rescue);
//   - retention deletes the finished tasks whose state's window
//     (RetentionConfig.Tasks) has passed since finished_at, with their
//     outbox rows and a DEAD task's DLQ entry (task.DeleteExpired, then
//     dlq.RemoveTasks; their audit rows go with their partition, below), and old SENT outbox rows (never the latest row of an
//     unfinished task, which the rescuer reads; DEAD rows stay for
//     forensics) and trims the task streams, never past an entry that is
//     pending or not yet delivered to any consumer group;
//   - the audit partitions' upkeep (partitions.go, PartitionsConfig)
//     creates the partitions of ingest_task_transition ahead of time and
//     drops a past partition once no transaction from before its end is
//     open and no task that still exists has a row in it;
//   - the idle-consumer cleanup removes the consumers of the group that
//     have been idle for long and have nothing pending (XINFO CONSUMERS and
//     XGROUP DELCONSUMER in one Lua script, so no pending entry is ever
//     dropped);
//   - the periodic service creates one task per slot of each Schedule
//     (Config.Periodic, INGEST_PERIODIC), keyed by schedule and slot so
//     that no slot gets two tasks, skipping the slots missed while no
//     process led (see periodic.go and Maintainer.NextSlots). It runs while
//     there are schedules;
//   - the releaser wakes the parked tasks of kinds with a concurrency or
//     rate limit as slots and starts free (task.Store.ReleaseParked), every
//     100 ms, and counts the parked tasks of each kind for
//     ingest_kind_waiting_tasks{kind,reason}, every 5 s, releasing those of
//     kinds neither paused nor limited (a resume that did not finish);
//   - with the releaser, the sequence counter counts the blocked sequences
//     of each kind (sequence keys held by a DEAD task) for
//     ingest_sequences_blocked{kind}, every 5 s (sequences.go).
//
// Each service runs in the same loop (after a random start delay within
// its interval, then once per interval, passes never overlapping) and
// logs or counts only what a pass did or why it failed. Each can be
// disabled in Config.
//
// Leader election: the Maintainer of every process takes part in one
// election per name, on a row of the table ingest_leader (name, leader_id,
// elected_at, expires_at). Acquiring is one INSERT ... ON CONFLICT DO
// UPDATE that succeeds when the row is missing, expired or already this
// process's; the leader renews it every RenewInterval; a leader that stops
// gracefully deletes it. Only single statements are used, so the election
// works through a transaction-pooling PgBouncer. Expiry is database time;
// the leader also keeps a local deadline on its monotonic clock (the time
// it sent its last successful renewal + TTL - Margin) which always passes
// before the row can be seen expired, and cancels its services the moment
// a renewal fails, finds another leader, or the deadline passes. So the
// services of two processes never run at once (given clocks that run at
// the same rate), and a leader that dies is replaced within about TTL +
// RetryInterval (3 s + 1 s by default).
//
// Metrics: ingest_leader{name} (1 while this process leads);
// outbox_rescued_total, ingest_task_retention_deleted_total{status},
// outbox_stream_trimmed_total{stream} and
// outbox_maintenance_errors_total{component} (rescuer, retention,
// partitions); the
// idle-consumer cleanup counts failures on
// ingest_stream_reclaim_total{result="error"}, as the reclaimer that ran it
// before did.
package maintenance
