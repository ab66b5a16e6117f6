// Package reclaim owns the reclaimer: the component every worker process
// runs to take over stream entries that another consumer (or this one) read
// but did not finish.
//
// Each round, the Reclaimer pages through the group's pending entries list
// (PEL) with XAUTOCLAIM and claims, for its own consumer, the entries idle for
// at least Config.MinIdle. It claims only what the processing path can run
// soon: it first reserves handler slots on the stream.Sink and asks
// XAUTOCLAIM for at most that many entries, keeping one slot that a page
// left unused for the round's next page; with no free slot it waits for
// one, ahead of the consumer's reads (when the Sink is a
// stream.SlotWaiter, as a worker's is), until Config.Interval has passed
// since the round began, and skips the rest of the round when none came
// free. The wait matters to a worker of one slot: its consumer's blocking
// read holds that slot while the streams are idle and would take it again
// as soon as the read returns. And it lets a round claim a backlog of
// idle entries (a dead worker's, entries handed back at a shutdown) as
// fast as the worker runs them, rather than one page of free slots per
// interval. Claimed entries go to
// the Sink exactly like a fresh delivery, so the task store's guarded
// start decides what happens (STARTED, or NOT_DUE / LEASE_HELD / FINISHED
// for entries claimed early or already finished elsewhere). The
// reclaimer never acks anything: the Sink does, after the outcome is
// committed in Postgres. Delivery stays at-least-once.
//
// What idle means:
//   - An entry whose worker died stops being refreshed by the heartbeat and
//     becomes claimable after MinIdle (the crash-detection time); its task's
//     expired lease gets it taken over sooner (below).
//   - A failed task's entry stays pending; the consumer sets its idle time
//     (XCLAIM ... IDLE) so that it reaches MinIdle when the retry falls due.
//     The reclaimer then finds it within one Interval of being due.
//   - A running task's entry is kept fresh by the heartbeat and is never
//     claimed while its handler runs.
//
// Taking over expired leases. MinIdle (INGEST_REDIS_RECLAIM_IDLE_MS, 10
// minutes by default) is a long time for a crashed worker's running tasks
// to wait, and their PostgreSQL lease (INGEST_TASK_LEASE_MS, 30 s, renewed
// by the heartbeat every third of it) knows sooner: the lease is the
// authority on whether a run's worker lives. So after its XAUTOCLAIM, each
// round (when Config.LeaseIdle, the worker's lease, is below MinIdle):
//
//  1. lists the group's consumers (XINFO CONSUMERS) and keeps those, other
//     than its own, with pending entries that have not read or claimed an
//     entry for LeaseIdle: a worker that runs tasks claims their entries
//     (the heartbeat's XCLAIM) every third of its lease, so a consumer
//     silent for a whole lease has stopped heart-beating (it died, hangs, or
//     cannot reach Redis); one with nothing to run may look silent too,
//     which only costs this look at its entries;
//  2. pages through each such consumer's pending entries idle for LeaseIdle
//     (XPENDING ... IDLE, at most 1,000 entries a round over all consumers,
//     the next round going on where this one stopped), reads their task ids
//     (XRANGE) and asks PostgreSQL which of those tasks are RUNNING under a
//     lease that expired and is not this consumer's (task.ExpiredLeases, by
//     primary key);
//  3. claims those entries for its own consumer with XCLAIM and min-idle
//     LeaseIdle, within the sink's free slots, and hands them to the sink,
//     where the start takes the task over (the abandoned run counts as a
//     failed attempt, the last one makes it DEAD; a run with a cancel
//     request ends CANCELLED), as for an entry XAUTOCLAIM found.
//
// A crashed worker's running task is so taken over about one lease after
// its last renewal, plus up to one Interval (the round), whatever MinIdle
// is: with the defaults about 30 to 35 s instead of 10 minutes. Other
// pending entries (not started, waiting for a retry, of a live lease, of no
// known task) still wait for MinIdle, as before. Counted as
// ingest_stream_reclaim_total{result="takeover"}.
//
// Races (the start, one guarded statement, decides each):
//   - The worker is alive but slow (a long GC pause, a stalled machine,
//     Postgres unreachable for it): while its heartbeat reaches Redis, its
//     entries stay fresh, so neither XPENDING's IDLE nor XCLAIM's min-idle
//     lets them go, even if the lease expired meanwhile; while it reaches
//     Postgres, the lease is renewed, and a lease renewed after the check
//     of step 2 makes the start refuse the takeover (a live lease: the
//     entry is deferred to the lease's end, and the owner's next heartbeat
//     XCLAIM takes it back). Only a worker silent on both for a whole lease
//     is taken over, as its lease allows; if it was only stalled, its
//     handler may still run when it resumes, until its next renewal (within
//     a third of a lease) finds the lease gone and cancels it, and its
//     outcome is refused (a conflict): the at-least-once every lease
//     expiry has meant, now reached a lease after the stall rather than
//     after MinIdle.
//   - Two reclaimers claim the same entry: XCLAIM with min-idle resets the
//     idle time, so the second claims nothing; and were the entry delivered
//     twice, the start is one guarded statement, so one takes the task over
//     and the other finds a live lease.
//   - The task finishes, or is taken over through another entry, between
//     step 2 and the start: the start finds it terminal (acknowledged) or
//     under a live lease (deferred).
//   - The expired lease is this consumer's own: a run of this process that
//     may go on (below); taking it over here would make a second run under
//     the same lease owner, which the completion guard could not tell from
//     the first. It is left to the other workers.
//   - A run abandoned by a live worker (its handler ignored its timeout:
//     the worker stops renewing the lease): that worker is heard from, so
//     it hands the run's entry to a consumer of its own that no worker reads
//     as (stream.AbandonedConsumer), silent from then on; once the lease has
//     expired, another worker's round takes the task over from there.
//
// Kafka mode has no reclaimer: the group's rebalance hands a dead member's
// partitions on once its session times out, their uncommitted records are
// read again, and the start takes over a task whose lease expired, or
// defers it to the end of a live one (package ingest, kafkaTransport). A
// run abandoned by a live member is not taken over until its handler
// returns: its partition stays with that member.
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
// (claimed), entries of expired leases taken over (takeover), deleted entry
// ids reported by XAUTOCLAIM (deleted) and failed
// operations (error; the idle-consumer cleanup of package maintenance
// counts its failures there too, see ErrorCounter).
package reclaim
