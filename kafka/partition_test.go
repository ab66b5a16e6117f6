package kafka_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
)

// TestPublisherKeepsATaskOnOnePartition: every record of one task (key =
// task id) goes to the same partition, whatever the batch it is in.
func TestPublisherKeepsATaskOnOnePartition(t *testing.T) {
	pub := kafka.NewPublisher(producer(t, cluster(t, 4)), 0)
	var msgs []outbox.Message
	for range 50 {
		msgs = append(msgs, outbox.Message{Stream: kafka.DefaultTopic, TaskID: uuid.New(), Kind: "k"})
	}
	first := map[uuid.UUID]int32{}
	for round := range 3 {
		batch := msgs
		if round == 2 {
			batch = msgs[:1] // alone
		}
		ids, errs := pub.Publish(context.Background(), batch)
		for i, m := range batch {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			_, p, _, _ := kafka.ParsePosition(ids[i])
			if want, ok := first[m.TaskID]; ok && want != p {
				t.Fatalf("round %d: task %s went to partitions %d and %d", round, m.TaskID, want, p)
			}
			first[m.TaskID] = p
		}
	}
}
