package kafka_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
)

// TestPublisherRecoversWhenBrokerComesBack: after failed attempts against
// an unreachable address, publishing succeeds soon after a broker listens
// there.
func TestPublisherRecoversWhenBrokerComesBack(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cl, err := kafka.NewProducerClient(kafka.Config{Brokers: []string{"127.0.0.1:" + strconv.Itoa(port)}, ProduceTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pub := kafka.NewPublisher(cl, 300*time.Millisecond)
	msg := []outbox.Message{{Stream: kafka.DefaultTopic, TaskID: uuid.New(), Kind: "k"}}
	for range 3 {
		if _, errs := pub.Publish(context.Background(), msg); errs[0] == nil {
			t.Fatal("publish succeeded with no broker")
		}
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(1, kafka.DefaultTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	testenv.Eventually(t, 20*time.Second, "a publish to the broker that came back", func() bool {
		_, errs := pub.Publish(context.Background(), msg)
		return errs[0] == nil
	})
	t.Logf("recovered after %s", time.Since(start))
}
