package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
)

func TestPublisherPublishes(t *testing.T) {
	brokers := cluster(t, 3)
	pub := kafka.NewPublisher(producer(t, brokers), 0)
	msgs := []outbox.Message{{Stream: kafka.DefaultTopic, TaskID: uuid.New(), Kind: "a"}, {Stream: kafka.DefaultTopic, TaskID: uuid.New(), Kind: "b"}}
	ids, errs := pub.Publish(context.Background(), msgs)
	for i := range msgs {
		if errs[i] != nil || ids[i] == "" {
			t.Fatalf("message %d: id %q, err %v", i, ids[i], errs[i])
		}
	}
	// Read them back.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(kafka.DefaultTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(seen) < len(msgs) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			v, err := kafka.Decode(r)
			if err != nil {
				t.Errorf("record %s: %v", kafka.RecordID(r), err)
			}
			seen[kafka.RecordID(r)] = true
			if v.TaskID != msgs[0].TaskID && v.TaskID != msgs[1].TaskID {
				t.Errorf("unexpected task %s", v.TaskID)
			}
		})
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("record %s not read back", id)
		}
	}
}

// TestPublisherUnreachableBrokerFailsInTime: with no broker listening the
// attempt fails within the produce timeout instead of hanging.
func TestPublisherUnreachableBrokerFailsInTime(t *testing.T) {
	cl, err := kafka.NewProducerClient(kafka.Config{Brokers: []string{unreachable(t)}, ProduceTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pub := kafka.NewPublisher(cl, 300*time.Millisecond)
	start := time.Now()
	ids, errs := pub.Publish(context.Background(), []outbox.Message{{Stream: kafka.DefaultTopic, TaskID: uuid.New(), Kind: "a"}})
	if errs[0] == nil {
		t.Fatalf("publish to an unreachable broker succeeded: %q", ids[0])
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("publish took %s; want it bounded by the produce timeout", d)
	}
}
