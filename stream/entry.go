package stream

import (
	"errors"
	"fmt"

	"github.com/ingest-worker/ingest/internal/clip"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Field names of a task entry (a contract: docs/ARCHITECTURE.md §4).
// Entry.Values writes them and ParseEntry reads them; nothing else spells
// them out.
const (
	FieldTaskID      = "task_id"
	FieldKind        = "kind"
	FieldTraceparent = "traceparent"
)

// MaxFields is the most fields a task entry may have. Entries carry two or
// three; a few more are tolerated for forward compatibility, more is a
// poison message.
const MaxFields = 16

// Sentinel errors of ParseEntry.
var (
	// ErrPoison marks an entry without a valid task_id: it cannot be mapped
	// to a task and goes to the DLQ with the reason.
	ErrPoison = errors.New("poison entry")
	// ErrDeleted marks a pending entry whose data is gone (XDEL or a trim
	// while it was pending): Redis returns its id without fields.
	ErrDeleted = errors.New("entry deleted from the stream")
)

// Entry is the content of one task-stream entry: which task to run. The
// payload stays in Postgres. Values encodes an Entry for XADD and
// ParseEntry decodes one read back; a field added to Entry is added in
// those two places, in this file.
type Entry struct {
	// TaskID is the task's id (ingest_task.id).
	TaskID uuid.UUID
	// Kind is the task's kind. It is informational (logs, dead letters):
	// Postgres holds the task's kind.
	Kind string
	// Traceparent is the W3C traceparent of the task's parent span, when
	// it has one (written only when set). Informational, like Kind: the
	// worker prefers the task's own (ingest_task.traceparent).
	Traceparent string
}

// Values returns the entry's fields as XADD field-value pairs, for
// redis.XAddArgs.Values.
func (e Entry) Values() []string {
	if e.Traceparent != "" {
		return []string{FieldTaskID, e.TaskID.String(), FieldKind, e.Kind, FieldTraceparent, e.Traceparent}
	}
	return []string{FieldTaskID, e.TaskID.String(), FieldKind, e.Kind}
}

// ParseEntry decodes a task entry read from the stream. An entry without a
// valid task_id (missing, not a canonical UUID, the nil UUID) or with more
// than MaxFields fields is ErrPoison, wrapped with the reason, and the
// returned Entry then holds its kind (if any) and the nil TaskID; an entry
// without fields is ErrDeleted.
func ParseEntry(msg redis.XMessage) (Entry, error) {
	if len(msg.Values) == 0 {
		return Entry{}, ErrDeleted
	}
	if len(msg.Values) > MaxFields {
		return Entry{}, fmt.Errorf("%w: %d fields, at most %d are allowed", ErrPoison, len(msg.Values), MaxFields)
	}
	e := Entry{Kind: FieldString(msg, FieldKind), Traceparent: FieldString(msg, FieldTraceparent)}
	raw, ok := msg.Values[FieldTaskID]
	if !ok {
		return e, fmt.Errorf("%w: no %s field", ErrPoison, FieldTaskID)
	}
	s, _ := raw.(string)
	// Only the canonical 36-character form: uuid.Parse also accepts
	// braces, urn: prefixes and hex without dashes.
	if len(s) != 36 {
		return e, fmt.Errorf("%w: %s %s is not a UUID", ErrPoison, FieldTaskID, Quote(s, 64))
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return e, fmt.Errorf("%w: %s %s is not a UUID", ErrPoison, FieldTaskID, Quote(s, 64))
	}
	if id == uuid.Nil {
		return e, fmt.Errorf("%w: %s is the nil UUID", ErrPoison, FieldTaskID)
	}
	e.TaskID = id
	return e, nil
}

// FieldString returns a field of msg as a string ("" when absent).
func FieldString(msg redis.XMessage, field string) string {
	switch v := msg.Values[field].(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// Quote returns s quoted for a log line or an error message, cut to at
// most max bytes of s (at a rune boundary) with the cut marked.
func Quote(s string, max int) string {
	return fmt.Sprintf("%q", Truncate(s, max))
}

// Truncate cuts s to at most max bytes at a rune boundary, marking a cut
// with "…".
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return clip.String(s, max) + "…"
}
