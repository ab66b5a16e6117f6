// Package ingest runs ingest tasks reliably: Postgres holds the truth about
// every task, a Redis Stream consumer group carries tasks to a pool of
// workers.
//
// It wires the packages of this module into a worker (task store, stream
// consumer, reclaimer, DLQ, outbox relay and rescuer) and defines the Go API
// library users see: Handler, Task, Permanent and RetryAfter.
package ingest
