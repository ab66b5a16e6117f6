// Package stream owns the consumer side of the Redis task stream and the
// format of its entries:
//
//   - Group: the consumer group (creation with MKSTREAM, acknowledgement
//     and idle-time control of pending entries, stream length and pending
//     count).
//   - Consumer: the loop that reads this consumer's entries into a Sink.
//   - Sink: the processing path the consumer and the reclaimer both feed,
//     and the reserve-then-read protocol that keeps reads within its free
//     handler slots.
//   - Forget: the removal of the entries of deleted tasks (XACK in every
//     group and XDEL), so that no worker reads an entry of no task.
//   - Entry: the entry codec. Entry.Values encodes an entry for XADD and
//     ParseEntry decodes one and tells a valid entry from a poison one. An
//     entry carries task_id and kind (docs/ARCHITECTURE.md §4); the payload
//     stays in Postgres.
//
// Entries are added by the outbox relay (package outbox), which encodes
// them with Entry.Values; idle entries are claimed by package reclaim,
// which feeds the same Sink.
//
// Guarantees:
//
//   - Delivery is at-least-once. The consumer never acknowledges anything:
//     the Sink decides, and acknowledges an entry only after its outcome is
//     committed in Postgres. An entry that is not acknowledged stays in the
//     group's pending entries list (PEL) and is claimed again later.
//   - The consumer first re-reads its own PEL (XREADGROUP ... 0), then reads
//     new entries (>). Reads block for a finite time (Config.Block), so a
//     cancelled context stops the loop within one Block.
//   - The consumer never reads more entries than the Sink has free slots for
//     (Sink.Reserve before every read). While entries flow it reads as many
//     as there are free slots without blocking; when there are none it
//     blocks for one, so an idle consumer holds one slot and leaves the
//     rest to the reclaimer feeding the same Sink. A Sink that is a
//     SlotWaiter lets a reclaim round wait for a slot ahead of the
//     consumer, so the one slot a blocking read holds goes to the round
//     when the read returns.
//   - A missing group (NOGROUP: the stream was deleted, or Redis restarted
//     empty) is recreated with MKSTREAM and reading continues; an existing
//     group (BUSYGROUP) is fine.
//   - Group.Touch and Group.SetIdle re-claim entries to this consumer with
//     XCLAIM ... JUSTID, which sets the idle time without raising the
//     delivery counter (on Redis; miniredis raises it).
package stream
