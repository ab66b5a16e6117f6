package kafka_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/kafka"
)

func TestValueRoundTrip(t *testing.T) {
	v := kafka.Value{TaskID: uuid.New(), Kind: "email"}
	r := kafka.Record("ingest.tasks", v)
	if string(r.Key) != v.TaskID.String() {
		t.Errorf("key %q, want the task id %s", r.Key, v.TaskID)
	}
	if want := `{"task_id":"` + v.TaskID.String() + `","kind":"email"}`; string(r.Value) != want {
		t.Errorf("value %s, want %s", r.Value, want)
	}
	got, err := kafka.Decode(r)
	if err != nil || got != v {
		t.Fatalf("Decode = %+v, %v; want %+v", got, err, v)
	}
}

func TestDecodePoison(t *testing.T) {
	for name, value := range map[string]string{
		"NotJSON":   `nope`,
		"NoTaskID":  `{"kind":"k"}`,
		"BadTaskID": `{"task_id":"x","kind":"k"}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := kafka.Decode(&kgo.Record{Value: []byte(value)})
			if !errors.Is(err, kafka.ErrPoison) {
				t.Fatalf("Decode(%s) = %v, want ErrPoison", value, err)
			}
		})
	}
}

func TestDeadLetterRoundTrip(t *testing.T) {
	e := dlq.Entry{TaskID: uuid.NewString(), Kind: "k", AttemptCount: 3, LastError: "boom",
		SourceID: "ingest.tasks/2/17", DeadAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	r := kafka.DeadLetterRecord("ingest.tasks.dlq", e)
	r.Topic, r.Partition, r.Offset = "ingest.tasks.dlq", 1, 9
	got, err := kafka.DecodeDeadLetter(r)
	if err != nil {
		t.Fatal(err)
	}
	e.ID = "ingest.tasks.dlq/1/9"
	if got != e {
		t.Errorf("round trip: got %+v, want %+v", got, e)
	}
}

func TestPositionRoundTrip(t *testing.T) {
	topic, p, off, err := kafka.ParsePosition(kafka.Position("a/b.c", 3, 42))
	if err != nil || topic != "a/b.c" || p != 3 || off != 42 {
		t.Fatalf("ParsePosition = %q %d %d %v", topic, p, off, err)
	}
	for _, bad := range []string{"", "x", "t/1", "t/x/1", "t/1/y"} {
		if _, _, _, err := kafka.ParsePosition(bad); err == nil {
			t.Errorf("ParsePosition(%q): no error", bad)
		}
	}
}
