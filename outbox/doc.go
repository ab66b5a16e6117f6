// Package outbox owns outbox_event: the transactional handover of tasks from
// Postgres to the Redis task stream, and keeping the two consistent.
// outbox_event is a view (migrations 00038, 00039) of two tables: outbox_row,
// whose rows are written NEW and marked SENT by the relay, and the outbox
// log, to which the rows of created tasks without a group or a sequence
// are appended and which the relay publishes in commit order, recording
// each pass's publish in one batch row rather than writing each row
// (log.go). The statements that write rows, the relay's claim (FOR
// UPDATE), the readings by status and what needs a table itself (the
// writers' lock, a pass's rows' xmax, the partitions) name the tables;
// those that read what a task's rows are, and the operator's queries,
// read the view.
//
// Insert writes an event in the caller's transaction (task creation, redrive,
// rescue, republish); a statement-level trigger NOTIFYs relays on commit (channel
// NotifyChannel), never for a rolled-back transaction, and only when the
// statement wrote a row a relay has to find: unsent and claimed by none (not
// for a row written SENT after a direct publish, nor for one claimed in its
// creating transaction by the process's own relay), and the transaction did
// not say that it wakes its process's relay itself (WakeByCaller, WakeDueSQL,
// Writer.Wake: a worker's completions, whose commits would otherwise queue
// on the server's notification lock).
//
// Relay publishes events through a Publisher: RedisPublisher (XADD, the
// default) or, in Kafka mode, kafka.Publisher. Any number of relays may run at once: a pass
// opens a transaction, locks a batch of due rows (NEW or RETRYING,
// next_retry_at come, no live claim of direct publishing) with FOR UPDATE
// SKIP LOCKED and takes the log's next rows (one pass at a time: an
// advisory lock); XADDs one entry {task_id, kind} per row to
// the row's stream in one pipelined round trip; and, in the same
// transaction, records the log rows' batch and marks each outbox_row
// row SENT (stream_id, sent_at), or on a failed XADD RETRYING with capped
// exponential backoff (package internal/backoff, the formula of failed
// tasks), DEAD after MaxAttempts (next_retry_at cleared, as for a DEAD
// task), and commits. Each row is written once per publish: the row locks
// are the claim (see pass.go). A relay never loses a row: a pass that
// fails or dies ends its transaction and leaves its rows as they were, and
// a pass that stalls in its transaction past its lease is terminated by
// the next relay's claim, after which its marking changes nothing.
// Relays wake on NOTIFY within milliseconds of a commit and poll as a
// fallback. A relay's claims read the claim index from a bound it keeps
// near the unsent rows, and from the front once every PublishInterval, so
// that a transaction held open, which keeps the index entries of every row
// sent since it began, does not make every claim read them; a row that
// sorts before the bound is published at most a poll period late (see
// scan.go).
//
// Delivery to the stream is at-least-once: a relay that stalls past its
// lease, or fails after its XADD, causes the row to be published again
// (at most the rows of that pass). A
// duplicate entry is harmless because starting a task is a guarded
// transition (package task).
//
// InsertDue writes an event due later (a delayed task; Kafka mode brings a task back at its
// retry time this way). When such a row of a task with a group falls due,
// the pass that claimed it first asks PostgreSQL (ingest_task_hold_due,
// migration 00032) whether the group's window has room: a task it parks
// instead has its row deleted rather than published (pass.go holdSQL),
// and the release that unparks it writes a new one.
//
// Writer is the one place that decides how the tasks a transaction makes
// due now reach the stream; package task writes the rows of the tasks it
// creates, and of the parked tasks it releases, through it (redrive,
// rescue and republish call Insert). The zero Writer writes NEW rows
// (Insert), which relays find on the NOTIFY. A Writer built on a relay (NewWriter) uses direct
// publishing while that relay runs and has room, which skips the NOTIFY
// and the claim: in Mode PublishClaimed it writes the rows already claimed
// by that relay and hands them over on commit; they are ordinary claimed
// rows, so any relay publishes them once the claim expires if the process
// dies first. In Mode PublishAfterCommit a transaction that creates tasks
// (StageCreated) writes no row: the relay XADDs the tasks after the commit
// and then writes each one's row once, SENT (half the writes); a crash
// before the XADD leaves the tasks to the rescuer. Tasks that existed
// before (Stage: released parked tasks) get claimed rows in either mode. A
// relay that is not running, or has DirectBacklog claims in flight, is
// not used: the rows are written NEW (see direct.go and writer.go).
//
// Keeping Postgres and Redis consistent beyond the relay is the work of the
// leader-run services of package maintenance: the rescuer republishes tasks
// that should be in Redis but are not (trimmed, deleted, or lost with Redis
// data) by giving each a new outbox row; retention deletes expired tasks
// without their outbox rows, which go when the leader drops their
// partition once every row in it is SENT or DEAD, and trims the task
// stream. Their SQL, which knows task states, lives in package task.
//
// Metrics (docs/ARCHITECTURE.md §6): outbox_backlog,
// outbox_backlog_age_seconds and outbox_scheduled (the due rows, how long
// the oldest has waited, and the delayed rows not yet due: see
// backlog.go), outbox_publish_total{result},
// outbox_publish_seconds{result}, outbox_publish_delay_seconds.
//
// The consumer group must be created at id 0 (XGROUP CREATE ... 0 MKSTREAM)
// when it is missing: entries the relay added before the group existed
// would otherwise never be delivered (the rescuer would republish them only
// after its grace period).
package outbox
