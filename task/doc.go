// Package task owns the task state machine and its store in Postgres.
//
// States and the allowed transitions are those of DESIGN §2. Every state
// change is ONE conditional UPDATE whose WHERE clause is the guard (status,
// lease owner, due time), run together with the insert of its audit row
// (package transition) in one transaction. A change whose guard does not
// match changes nothing and is reported as not applied: it is never an error.
// Decisions that depend on the row (RETRYING or DEAD, the backoff delay) are
// made inside the UPDATE against the row's current attempt_count, never
// against a copy in memory.
//
// Every operation after creation takes many ids at once, so a consumer
// starts or completes a whole read batch in one statement. Rows are locked
// in id order, so concurrent batches never deadlock one another.
//
// Creating a task also writes its outbox_event row (package outbox) in the
// same transaction; with CreateTx that is the caller's own pgx.Tx, so a task
// commits atomically with the caller's business data.
package task
