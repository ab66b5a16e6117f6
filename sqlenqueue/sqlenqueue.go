package sqlenqueue

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ingest-worker/ingest/task"
)

// The SQLSTATE codes the functions raise. The exception's column field
// names the bad field (kind, payload, idempotency_key, ...); its message
// is the HTTP API's for that field, prefixed "task N: " (0-based) by
// ingest_enqueue_batch.
const (
	// CodeInvalid (invalid_parameter_value) is a bad field: a value out
	// of range, of the wrong JSON type, an unknown field.
	CodeInvalid = "22023"
	// CodeTooLarge (program_limit_exceeded) is a payload over the size
	// limit (the API's 413).
	CodeTooLarge = "54000"
)

// Options are the fields the functions accept besides kind and payload:
// the create options of POST /v1/tasks but ref (a batch from SQL names its
// dependencies by id), plus traceparent and dedup_by_payload
// (task.NewTask's), in the order the hint of an unknown field lists them.
// Any other field is refused with CodeInvalid, naming it.
var Options = []string{"idempotency_key", "max_attempts", "run_at", "delay_ms", "timeout_ms", "traceparent", "dedup_by_payload", "priority", "group_key",
	"depends_on", "on_dependency_failure", "sequence_key"}

// FieldError returns the task.FieldError of a rejection by the functions
// (err wraps a *pgconn.PgError with one of the codes above), or nil for
// any other error.
func FieldError(err error) *task.FieldError {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || (pg.Code != CodeInvalid && pg.Code != CodeTooLarge) {
		return nil
	}
	return &task.FieldError{Field: pg.ColumnName, Msg: pg.Message, TooLarge: pg.Code == CodeTooLarge}
}
