package stream

import (
	"errors"
	"fmt"

	"github.com/ingest-worker/ingest/internal/clip"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Entry field names (DESIGN §4, contract).
const (
	FieldTaskID = "task_id"
	FieldKind   = "kind"
)

// MaxFields is the most fields a task entry may have. Entries carry two;
// a few more are tolerated for forward compatibility, more is a poison
// message.
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

// ParseEntry returns the task id and kind of a task entry. An entry
// without a valid task_id (missing, not a canonical UUID, the nil UUID) or
// with more than MaxFields fields is ErrPoison, wrapped with the reason; an
// entry without fields is ErrDeleted. kind is informational: Postgres holds
// the task's kind.
func ParseEntry(msg redis.XMessage) (taskID uuid.UUID, kind string, err error) {
	if len(msg.Values) == 0 {
		return uuid.Nil, "", ErrDeleted
	}
	if len(msg.Values) > MaxFields {
		return uuid.Nil, "", fmt.Errorf("%w: %d fields, at most %d are allowed", ErrPoison, len(msg.Values), MaxFields)
	}
	kind = FieldString(msg, FieldKind)
	raw, ok := msg.Values[FieldTaskID]
	if !ok {
		return uuid.Nil, kind, fmt.Errorf("%w: no %s field", ErrPoison, FieldTaskID)
	}
	s, _ := raw.(string)
	// Only the canonical 36-character form: uuid.Parse also accepts
	// braces, urn: prefixes and hex without dashes.
	if len(s) != 36 {
		return uuid.Nil, kind, fmt.Errorf("%w: %s %s is not a UUID", ErrPoison, FieldTaskID, Quote(s, 64))
	}
	id, perr := uuid.Parse(s)
	if perr != nil {
		return uuid.Nil, kind, fmt.Errorf("%w: %s %s is not a UUID", ErrPoison, FieldTaskID, Quote(s, 64))
	}
	if id == uuid.Nil {
		return uuid.Nil, kind, fmt.Errorf("%w: %s is the nil UUID", ErrPoison, FieldTaskID)
	}
	return id, kind, nil
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
