package kafka_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/kafka"
)

// cluster starts an in-process Kafka cluster with the task and DLQ topics
// (partitions each) and returns its bootstrap addresses.
func cluster(t *testing.T, partitions int32) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, kafka.DefaultTopic, kafka.DefaultDLQTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// unreachable returns an address nothing listens on.
func unreachable(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func producer(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kafka.NewProducerClient(kafka.Config{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// recordingSink is a Sink with unlimited slots that records deliveries and
// settles each through settle (nil: leave it unsettled).
type recordingSink struct {
	mu     sync.Mutex
	got    []kafka.Delivery
	settle func(kafka.Delivery)
	freed  chan struct{}
}

func newRecordingSink() *recordingSink { return &recordingSink{freed: make(chan struct{})} }

func (s *recordingSink) Reserve(n int) int          { return n }
func (s *recordingSink) SlotFreed() <-chan struct{} { return s.freed }
func (s *recordingSink) Process(_ context.Context, ds []kafka.Delivery, _ int) {
	s.mu.Lock()
	s.got = append(s.got, ds...)
	f := s.settle
	s.mu.Unlock()
	if f != nil {
		for _, d := range ds {
			f(d)
		}
	}
}

func (s *recordingSink) deliveries() []kafka.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]kafka.Delivery(nil), s.got...)
}

func (s *recordingSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}
