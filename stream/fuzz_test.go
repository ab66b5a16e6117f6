package stream_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/stream"
)

// FuzzParseEntry: whatever a stream entry holds, ParseEntry does not panic,
// accepts only entries whose task_id is a canonical non-nil UUID, and
// otherwise returns ErrDeleted (no fields) or ErrPoison with a short,
// printable reason. An accepted entry encodes (Entry.Values) to one that
// decodes to it again. Run: go test -run='^$' -fuzz='^FuzzParseEntry$' ./stream
func FuzzParseEntry(f *testing.F) {
	f.Add("0b6f0f43-6f4e-4f43-9a5e-0e6a8d1c2b3a", "ok", uint8(0), false, false)
	f.Add("0B6F0F43-6F4E-4F43-9A5E-0E6A8D1C2B3A", "ok", uint8(1), false, false)
	f.Add("{0b6f0f43-6f4e-4f43-9a5e-0e6a8d1c2b3a}", "ok", uint8(0), false, false)
	f.Add("urn:uuid:0b6f0f43-6f4e-4f43-9a5e-0e6a8d1c2b3a", "", uint8(0), false, false)
	f.Add("0b6f0f436f4e4f439a5e0e6a8d1c2b3a", "ok", uint8(0), false, false)
	f.Add(uuid.Nil.String(), "ok", uint8(0), false, false)
	f.Add("", "", uint8(255), false, false)
	f.Add("not-a-uuid", "\xff\xfe", uint8(20), false, false)
	f.Add("0b6f0f43-6f4e-4f43-9a5e-0e6a8d1c2b3a", "ok", uint8(14), true, false)
	f.Add("0b6f0f43-6f4e-4f43-9a5e-0e6a8d1c2b3a", "ok", uint8(0), false, true)
	f.Add(strings.Repeat("\xe2\x82\xac", 100), strings.Repeat("k", 500), uint8(3), false, false)
	f.Fuzz(func(t *testing.T, taskID, kind string, extra uint8, omitTaskID, nonString bool) {
		msg := redis.XMessage{ID: "1-1", Values: map[string]any{}}
		if extra != 255 { // 255: a deleted entry (no fields)
			msg.Values[stream.FieldKind] = kind
			switch {
			case omitTaskID:
			case nonString:
				msg.Values[stream.FieldTaskID] = int64(len(taskID))
			default:
				msg.Values[stream.FieldTaskID] = taskID
			}
			for i := range int(extra % 24) {
				msg.Values[fmt.Sprintf("x%d", i)] = taskID
			}
		}
		e, err := stream.ParseEntry(msg)
		id, gotKind := e.TaskID, e.Kind
		if err != nil {
			if id != uuid.Nil {
				t.Fatalf("error %v with a non-nil id %s", err, id)
			}
			deleted, poison := errors.Is(err, stream.ErrDeleted), errors.Is(err, stream.ErrPoison)
			if deleted == poison {
				t.Fatalf("error %v: want exactly one of ErrDeleted and ErrPoison", err)
			}
			if deleted != (len(msg.Values) == 0) {
				t.Fatalf("ErrDeleted=%v for an entry with %d fields", deleted, len(msg.Values))
			}
			if s := err.Error(); len(s) > 300 || !utf8.ValidString(s) {
				t.Fatalf("reason is %d bytes (valid UTF-8: %v); want a short printable one", len(s), utf8.ValidString(s))
			}
			return
		}
		raw, _ := msg.Values[stream.FieldTaskID].(string)
		if id == uuid.Nil || len(raw) != 36 || !strings.EqualFold(raw, id.String()) {
			t.Fatalf("accepted task_id %q as %s", raw, id)
		}
		if len(msg.Values) > stream.MaxFields {
			t.Fatalf("accepted an entry of %d fields", len(msg.Values))
		}
		if gotKind != kind {
			t.Fatalf("kind %q, want %q", gotKind, kind)
		}
		if again, err := stream.ParseEntry(redis.XMessage{ID: "1-2", Values: valuesMap(e.Values())}); err != nil || again != e {
			t.Fatalf("re-encoded entry %+v parsed as %+v, %v", e, again, err)
		}
		if tr := stream.Truncate(kind, 200); len(tr) > 200+len("…") || (utf8.ValidString(kind) && !utf8.ValidString(tr)) {
			t.Fatalf("Truncate(%q, 200) = %q", kind, tr)
		}
	})
}

// valuesMap turns XADD field-value pairs into the map XREAD returns.
func valuesMap(pairs []string) map[string]any {
	m := make(map[string]any, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return m
}
