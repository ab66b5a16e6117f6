package kafka

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/dlq"
)

// ErrPoison is wrapped by the error of a record that names no valid task.
var ErrPoison = errors.New("poison record")

// Value is the value of a task record: which task to run. The record's key
// is the task id too, so every record of one task lands on one partition.
type Value struct {
	TaskID uuid.UUID `json:"task_id"`
	Kind   string    `json:"kind"`
	// Traceparent is the task's W3C trace context, carried in the record
	// header TraceparentHeader, not in the value ("" when none).
	Traceparent string `json:"-"`
}

// TraceparentHeader is the record header that carries a task's trace
// context.
const TraceparentHeader = "traceparent"

// Record returns the task record of v for topic.
func Record(topic string, v Value) *kgo.Record {
	b, _ := json.Marshal(v) // cannot fail: a UUID and a string
	r := &kgo.Record{Topic: topic, Key: []byte(v.TaskID.String()), Value: b}
	if v.Traceparent != "" {
		r.Headers = []kgo.RecordHeader{{Key: TraceparentHeader, Value: []byte(v.Traceparent)}}
	}
	return r
}

// traceparent returns the record's TraceparentHeader ("" when none).
func traceparent(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == TraceparentHeader {
			return string(h.Value)
		}
	}
	return ""
}

// Decode parses a task record's value. A value that is not JSON or has no
// valid task_id is poison (ErrPoison); the kind is returned when readable.
func Decode(r *kgo.Record) (Value, error) {
	var raw struct {
		TaskID string `json:"task_id"`
		Kind   string `json:"kind"`
	}
	if err := json.Unmarshal(r.Value, &raw); err != nil {
		return Value{}, fmt.Errorf("%w: value is not a JSON object: %v", ErrPoison, err)
	}
	id, err := uuid.Parse(raw.TaskID)
	if err != nil {
		return Value{Kind: raw.Kind}, fmt.Errorf("%w: bad task_id %q", ErrPoison, raw.TaskID)
	}
	return Value{TaskID: id, Kind: raw.Kind, Traceparent: traceparent(r)}, nil
}

// RawTaskID returns the task_id field of a record's value as written, or
// the record key when the value has none (for dead-lettering poison).
func RawTaskID(r *kgo.Record) string {
	var raw struct {
		TaskID string `json:"task_id"`
	}
	if json.Unmarshal(r.Value, &raw) == nil && raw.TaskID != "" {
		return raw.TaskID
	}
	return string(r.Key)
}

// DeadLetterRecord returns the record of e for the DLQ topic: key the task
// id, value the JSON of e (task_id, kind, attempt_count, last_error,
// source_id, dead_at).
func DeadLetterRecord(topic string, e dlq.Entry) *kgo.Record {
	e.ID = ""
	b, _ := json.Marshal(e) // cannot fail: strings, an int and a time
	return &kgo.Record{Topic: topic, Key: []byte(e.TaskID), Value: b}
}

// DecodeDeadLetter parses a DLQ record; the entry's ID is the record's
// position (RecordID).
func DecodeDeadLetter(r *kgo.Record) (dlq.Entry, error) {
	var e dlq.Entry
	if err := json.Unmarshal(r.Value, &e); err != nil {
		return dlq.Entry{}, fmt.Errorf("dlq record %s: %w", RecordID(r), err)
	}
	e.ID = RecordID(r)
	return e, nil
}

// RecordID names a record by its position: "topic/partition/offset". It is
// the id stored in outbox_event.stream_id and dlq source_id in Kafka mode.
func RecordID(r *kgo.Record) string { return Position(r.Topic, r.Partition, r.Offset) }

// Position formats a record position as RecordID does.
func Position(topic string, partition int32, offset int64) string {
	return fmt.Sprintf("%s/%d/%d", topic, partition, offset)
}

// ParsePosition parses a RecordID.
func ParsePosition(id string) (topic string, partition int32, offset int64, err error) {
	var p int32
	var o int64
	i := lastSlash(id)
	if i < 0 {
		return "", 0, 0, fmt.Errorf("bad record id %q", id)
	}
	j := lastSlash(id[:i])
	if j < 0 {
		return "", 0, 0, fmt.Errorf("bad record id %q", id)
	}
	if _, err := fmt.Sscanf(id[j+1:], "%d/%d", &p, &o); err != nil {
		return "", 0, 0, fmt.Errorf("bad record id %q", id)
	}
	return id[:j], p, o, nil
}

func lastSlash(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return i
		}
	}
	return -1
}
