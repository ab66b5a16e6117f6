// Package task owns the task state machine and its store in Postgres.
//
// States and the allowed transitions are those of docs/ARCHITECTURE.md §2.
// Every state change is ONE conditional UPDATE whose WHERE clause is the
// guard (status, lease owner, due time), and its audit row in
// ingest_task_transition commits with it:
//
//   - Start, Succeed, Fail and Release write their audit rows themselves:
//     the UPDATE and an INSERT INTO ingest_task_transition are CTEs of one
//     statement (task/transitions.go), so change and audit row are one
//     implicit transaction and one round trip.
//   - Creation and Redrive insert theirs with transition.Insert in the same
//     pgx.Tx as the change.
//
// A change whose guard does not match changes nothing, writes no audit row
// and is reported as not applied: it is never an error. Decisions that
// depend on the row (RETRYING or DEAD, the backoff delay) are made inside
// the UPDATE against the row's current attempt_count, never against a copy
// in memory. Renew extends a lease; it is no state change and writes no
// audit row.
//
// Results and progress (pipeline.go, migration 00017): SucceedWith writes
// each run's result with its success, in the success statement; the
// result's limit (Config.MaxResultBytes, DefaultMaxResultBytes) and its
// check (CheckResult) are this package's. SetProgress writes a run's
// progress with one guarded UPDATE fenced by the attempt (and the lease,
// for library runs), no state change and no audit row; the statements
// that start a run or send it back to waiting clear it. Tasks that end
// while an Awaiter (await.go) waits for them (ingest_task_awaited) are
// announced on DoneChannel by a trigger on the audit table, and the Awaiter
// serves any number of waits with one LISTEN connection.
//
// Dependencies (deps.go, deps_redrive.go, migration 00018): a task created
// with NewTask.DependsOn or DependsOnRefs is held (waiting_for > 0, refused
// by the start guard, its outbox row due at HeldUntil) until its
// dependencies end. linkDependencies creates the edges and owns the
// create-time checks and limits (MaxDependencies, MaxDependencyDepth,
// refs and cycles); the release and the cancel of dependents when a
// dependency ends are the migration's statement triggers, in the
// transaction of that end. RedriveWithDependents revives the dependents a
// death cancelled; DependencyResults reads a dependent's inputs.
//
// Every operation after creation takes many ids at once, so a consumer
// starts or completes a whole read batch in one statement. Rows are changed
// (and, where a statement locks them first, locked) in id order, so
// concurrent batches never deadlock one another.
//
// The planner rule of those statements: work in proportion to the ids,
// never to the table, whatever the statistics say (none on a database
// freshly migrated, restored or truncated; a table analyzed while empty).
// A statement that joins an id array to ingest_task is sent with package
// internal/pgplan's settings in its round trip (no sequential scan, hash or
// merge join: only primary-key probes are left); a look-up by other keys
// (idempotency key, payload dedup) is a LATERAL probe per key; a guard on
// an UPDATE's target row is a CASE (targetGuard), so that no index of a
// state is used to find the rows. The plan tests (plan_test.go) check each
// hot statement on a never-analyzed database, empty and grown.
//
// Parking (kind.go, limit.go) is no state change either: a QUEUED or
// RETRYING task whose kind is paused or at a limit gets parked_at set,
// which keeps it from being due (the guard due) until ReleaseParked
// clears it and gives it a new outbox event. (Release, a worker handing
// back its RUNNING tasks at shutdown, is another thing: a state change.)
// Groups (group.go) use the same parking: a task whose group is at the
// kind's per-group limit is parked at its start, and a task created
// beyond its group's window is created parked, without an outbox event;
// the release serves the groups round-robin.
//
// Creating a task writes the task and its audit row and hands the tasks due
// now to an outbox.Writer in the same transaction, and the claim it
// returns is finished once the transaction has ended (published on commit,
// discarded on a rollback); a delayed task gets its outbox row, due with
// it, directly (outbox.InsertDue). Which publishing path a task takes (a
// NEW row for the NOTIFY-woken relays, a row claimed by this process's
// relay, or no row until that relay has published it) is package outbox's
// decision, made by the writer given with PublishWith; the store holds
// that writer and nothing else of the relay. ReleaseParked goes through
// the same writer. With CreateTx the transaction is the caller's own
// pgx.Tx, so a task commits atomically with the caller's business data;
// the store does not own that commit and uses the zero writer (NEW rows).
//
// No SQL outside this package (and the migrations) names a task state. The
// statements other components need that select tasks by state live here as
// functions on a DB (a pool or a transaction): the rescuer's
// (RescueCandidates, Rescue), the reclaimer's republishing of deleted
// stream entries (RepublishDeleted) and the deletion of finished tasks
// (DeleteExpired, whose audit and outbox rows go with their partitions;
// DeleteTerminal, with them), which return the stream entries their
// outbox rows had published, for the caller to remove with
// stream.Forget). Their guards (a task is due, startable, terminal)
// are SQL fragments written once (guards.go), shared with Start.
//
// The store also owns the rules of its input (fields.go), which the HTTP
// API, the CLI and the dashboard apply through it: each whole-number field
// has one Range (MaxAttemptsRange, DelayRange, TimeoutRange,
// ListLimitRange, RedriveLimitRange, ConcurrencyRange), checked before a
// value could be narrowed to a column; a name users choose (a kind, an
// idempotency key) follows CheckName (valid UTF-8, no control or
// bidirectional character), and a filter or note CheckText (valid UTF-8,
// no NUL). A bad field is a *FieldError naming it.
//
// Sequences (sequence.go, migration 00020): the tasks of one kind with the
// same NewTask.SequenceKey run one at a time, in creation order. Creation
// serialises a key's creators with an advisory lock, numbers each task
// (sequence_no) and gives it one 'sequence' edge to the previous task that
// has not let its successors go, so it is held like a task with
// dependencies (deps.go) until that task's end releases it; a DEAD one
// releases it only under the kind's SequenceContinue. Blocked sequences
// (held by a DEAD task) are listed and counted here (BlockedSequences).
package task
