// Package sqlenqueue is the Go side of transactional enqueue from SQL:
// ingest_enqueue(kind, payload, options) and ingest_enqueue_batch(tasks),
// the PostgreSQL functions of migration 00016, which create tasks inside
// any transaction of any client, exactly as task.Store.CreateTx does.
//
// It owns the functions' error contract (the SQLSTATE codes, Options, and
// FieldError, which turns a rejection into the task.FieldError the Go
// store would have returned) and the tests that hold the SQL to the Go
// rules: the rows it writes against CreateTx's, its limits against package
// task's constants, its messages against the HTTP API's, the producer
// role's grants, and real clients (Python's psycopg, Node.js's pg)
// enqueueing in transactions that commit and roll back. The SQL itself is
// the migration's; docs/SQL-ENQUEUE.md is the user's guide.
package sqlenqueue
