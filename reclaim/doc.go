// Package reclaim owns the reclaimer: the component every worker process
// runs to take over stream entries that another consumer (or this one) read
// but did not finish.
//
// Each round, the Reclaimer pages through the group's pending entries list
// (PEL) with XAUTOCLAIM and claims, for its own consumer, the entries idle for
// at least Config.MinIdle. It claims only what the processing path can run
// soon: it first reserves handler slots on the stream.Sink and asks
// XAUTOCLAIM for at most that many entries; with no free slot it skips the
// round. Claimed entries go to the Sink exactly like a fresh delivery, so the
// task store's guarded start decides what happens (STARTED, or NOT_DUE /
// SKIPPED for entries claimed early or already finished elsewhere). The
// reclaimer never acks anything: the Sink does, after the outcome is
// committed in Postgres. Delivery stays at-least-once.
//
// What idle means:
//   - An entry whose worker died stops being refreshed by the heartbeat and
//     becomes claimable after MinIdle (the crash-detection time).
//   - A failed task's entry stays pending; the consumer sets its idle time
//     (XCLAIM ... IDLE) so that it reaches MinIdle when the retry falls due.
//     The reclaimer then finds it within one Interval of being due.
//   - A running task's entry is kept fresh by the heartbeat and is never
//     claimed while its handler runs.
//
// Deleted entries: on Redis 7, XAUTOCLAIM also reports (and removes from the
// PEL) pending entries that no longer exist in the stream because they were
// trimmed or deleted. The reclaimer maps each id back to its task through
// outbox_event.stream_id and, when the task is not terminal and no later
// outbox event exists for it, republishes it from Postgres by inserting a new
// outbox event in a transaction (task.RepublishDeleted). Ids that cannot be
// republished at once (Postgres down) are retried in the next rounds; the
// rescuer (package maintenance) is the last line for a process that dies
// meanwhile.
//
// Idle consumers are not removed here: the leader-run consumer cleanup of
// package maintenance does it.
//
// Metrics: ingest_stream_reclaim_total{result} counts claimed entries
// (claimed), deleted entry ids reported by XAUTOCLAIM (deleted) and failed
// operations (error; the idle-consumer cleanup of package maintenance
// counts its failures there too, see ErrorCounter).
package reclaim
