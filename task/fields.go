package task

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/stream"
)

// Range is the inclusive range of a whole-number field of a request: the
// one place where that field's bounds are written. The HTTP API, the CLI,
// the dashboard and the store check a value with Check (or Parse, for
// text) and so refuse an out-of-range value with the same message, naming
// the field and its range, before it is narrowed to a column's type.
type Range struct {
	// Field is the field's name in requests (max_attempts, limit).
	Field    string
	Min, Max int64
}

// The ranges of the numeric fields the task store owns.
var (
	// MaxAttemptsRange bounds a task's own max_attempts and a store's
	// Config.MaxAttempts (INGEST_REDIS_MAX_ATTEMPTS).
	MaxAttemptsRange = Range{Field: "max_attempts", Min: 1, Max: MaxAttemptsLimit}
	// DelayRange bounds a new task's delay_ms (NewTask.Delay).
	DelayRange = Range{Field: "delay_ms", Min: 0, Max: MaxDelay.Milliseconds()}
	// TimeoutRange bounds a new task's timeout_ms (NewTask.Timeout); 0:
	// the worker's default.
	TimeoutRange = Range{Field: "timeout_ms", Min: 0, Max: MaxTimeout.Milliseconds()}
	// PriorityRange bounds a new task's priority (NewTask.Priority): 1,
	// the highest, to 4; 0 (none given) is the default, 2.
	PriorityRange = Range{Field: "priority", Min: stream.HighestPriority, Max: stream.LowestPriority}
	// ListLimitRange bounds ListParams.Limit (a page of a listing).
	ListLimitRange = Range{Field: "limit", Min: 1, Max: MaxListLimit}
	// RedriveLimitRange bounds RedriveFilter.Limit.
	RedriveLimitRange = Range{Field: "limit", Min: 1, Max: MaxRedriveLimit}
	// ConcurrencyRange bounds a kind's concurrency limit (0: none).
	ConcurrencyRange = Range{Field: "concurrency", Min: 0, Max: MaxConcurrency}
	// PayloadBytesRange bounds Config.MaxPayloadBytes
	// (INGEST_MAX_PAYLOAD_BYTES): from the smallest JSON value with
	// content ("{}") to the largest jsonb value PostgreSQL stores.
	PayloadBytesRange = Range{Field: "max_payload_bytes", Min: 2, Max: MaxPayloadBytesLimit}
	// ResultBytesRange bounds Config.MaxResultBytes
	// (INGEST_RESULT_MAX_BYTES), like PayloadBytesRange.
	ResultBytesRange = Range{Field: "max_result_bytes", Min: 2, Max: MaxPayloadBytesLimit}
	// AttemptRange bounds the attempt a progress report names.
	AttemptRange = Range{Field: "attempt", Min: 1, Max: MaxAttemptsLimit}
	// ProgressPercentRange bounds a progress report's percent.
	ProgressPercentRange = Range{Field: "percent", Min: 0, Max: 100}
	// RetentionRange bounds a retention window of finished tasks in
	// milliseconds (INGEST_RETENTION_SUCCEEDED, _CANCELLED, _DEAD; 0:
	// kept forever).
	RetentionRange = Range{Field: "retention", Min: 0, Max: MaxRetention.Milliseconds()}
)

// MaxRetention is the longest retention window of finished tasks: ten
// years (longer is forever, a window of 0).
const MaxRetention = 10 * 365 * 24 * time.Hour

// MaxAttemptsLimit is the largest max_attempts: far beyond any useful
// number of runs (a million retries at a one-hour backoff take a century),
// and well inside the int column that stores it.
const MaxAttemptsLimit = 1_000_000

// MaxPayloadBytesLimit is the largest payload limit a store may have: the
// largest jsonb value PostgreSQL stores (2^28 - 1 bytes).
const MaxPayloadBytesLimit = 1<<28 - 1

// Text says the range in words: "from 1 to 1000000".
func (r Range) Text() string { return fmt.Sprintf("from %d to %d", r.Min, r.Max) }

// Contains reports whether v is in r.
func (r Range) Contains(v int64) bool { return v >= r.Min && v <= r.Max }

// Check returns nil when v is in r, else the FieldError naming the field
// and its range.
func (r Range) Check(v int64) *FieldError {
	if r.Contains(v) {
		return nil
	}
	return &FieldError{Field: r.Field, Msg: fmt.Sprintf("%s must be a whole number %s, got %d", r.Field, r.Text(), v)}
}

// Parse reads a decimal whole number in r (a query parameter, a form
// value, a flag): anything else, a fraction or a number too large for any
// integer type included, is the FieldError naming the field and its
// range.
func (r Range) Parse(s string) (int64, *FieldError) {
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, &FieldError{Field: r.Field, Msg: fmt.Sprintf("%s must be a whole number %s, got %q", r.Field, r.Text(), clip.String(s, 64))}
	}
	return v, r.Check(v)
}

// Millis converts a count of milliseconds in r to a duration: a value
// out of r (which could overflow a time.Duration) is the FieldError.
func (r Range) Millis(ms int64) (time.Duration, *FieldError) {
	if ferr := r.Check(ms); ferr != nil {
		return 0, ferr
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// checkMillis checks a duration against r, a range of milliseconds.
func (r Range) checkMillis(d time.Duration) *FieldError {
	lo, hi := time.Duration(r.Min)*time.Millisecond, time.Duration(r.Max)*time.Millisecond
	if d >= lo && d <= hi {
		return nil
	}
	got := strconv.FormatInt(d.Milliseconds(), 10)
	if d%time.Millisecond != 0 {
		got = d.String()
	}
	return &FieldError{Field: r.Field, Msg: fmt.Sprintf("%s must be a whole number %s, got %s", r.Field, r.Text(), got)}
}

// CheckName checks a name users choose (a kind, an idempotency key), in
// field, at most maxBytes long: it must be valid UTF-8 and hold no control
// character (new lines, tabs, ESC, NUL, DEL and the C1 controls included)
// and no bidirectional control, which would otherwise reach terminals and
// pages as it is (termsafe.Unsafe). The one rule of names: kinds of new
// tasks and of kind settings, idempotency keys, periodic schedules.
func CheckName(field, name string, maxBytes int) *FieldError {
	bad := func(format string, args ...any) *FieldError {
		return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case len(name) > maxBytes:
		return bad("%s is longer than %d bytes", field, maxBytes)
	case !utf8.ValidString(name):
		return bad("%s must be valid UTF-8", field)
	}
	for i, r := range name {
		if termsafe.Unsafe(r) {
			return bad("%s must not hold control or bidirectional characters, got %s at byte %d", field, termsafe.String(string(r)), i)
		}
	}
	return nil
}

// CheckText checks a text value that goes to PostgreSQL as a filter or a
// note (a kind filter, error_contains, a cancel reason): valid UTF-8
// without NUL, which a text column cannot hold.
func CheckText(field, s string) *FieldError {
	switch {
	case !utf8.ValidString(s):
		return &FieldError{Field: field, Msg: fmt.Sprintf("%s must be valid UTF-8", field)}
	case strings.IndexByte(s, 0) >= 0:
		return &FieldError{Field: field, Msg: fmt.Sprintf("%s must not hold a NUL character", field)}
	}
	return nil
}
