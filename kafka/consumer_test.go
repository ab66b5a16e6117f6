package kafka_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
)

func produceN(t *testing.T, brokers []string, n int) map[uuid.UUID]bool {
	t.Helper()
	cl := producer(t, brokers)
	want := map[uuid.UUID]bool{}
	var recs []*kgo.Record
	for range n {
		id := uuid.New()
		want[id] = true
		recs = append(recs, kafka.Record(kafka.DefaultTopic, kafka.Value{TaskID: id, Kind: "k"}))
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return want
}

func startConsumer(t *testing.T, brokers []string, sink kafka.Sink) (*kafka.Consumer, context.CancelFunc) {
	t.Helper()
	c, err := kafka.NewConsumer(kafka.Config{Brokers: brokers, CommitInterval: 20 * time.Millisecond}, sink, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			c.Close()
		})
	}
	t.Cleanup(stop)
	return c, stop
}

// committed returns the group's committed offsets summed over partitions.
func committed(t *testing.T, brokers []string) int64 {
	t.Helper()
	adm := kadm.NewClient(producer(t, brokers))
	offs, err := adm.FetchOffsets(context.Background(), kafka.DefaultGroup)
	if err != nil {
		return -1
	}
	var sum int64
	offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
	return sum
}

// TestConsumerCommitsOnlySettled: offsets move only past settled records,
// and a second member of the group gets the unsettled ones again.
func TestConsumerCommitsOnlySettled(t *testing.T) {
	brokers := cluster(t, 1)
	want := produceN(t, brokers, 10)
	sink := newRecordingSink()
	c, stop := startConsumer(t, brokers, sink)
	testenv.Eventually(t, 10*time.Second, "10 deliveries", func() bool { return sink.count() == 10 })
	ds := sink.deliveries()
	for _, d := range ds {
		if d.Err != nil || !want[d.Value.TaskID] {
			t.Fatalf("delivery %+v", d)
		}
	}
	// Settle the first 3 and the 5th: the commit point is offset 3.
	c.Settle(ds[0].ID, ds[1].ID, ds[2].ID, ds[4].ID)
	testenv.Eventually(t, 10*time.Second, "offset 3 committed", func() bool { return committed(t, brokers) == 3 })
	stop() // killed without settling the rest: nothing more is committed
	if got := committed(t, brokers); got != 3 {
		t.Fatalf("committed %d after stop, want 3", got)
	}
	// The next member re-reads from offset 3: 7 records, the settled 5th among them.
	sink2 := newRecordingSink()
	sink2.settle = func(d kafka.Delivery) {}
	startConsumer(t, brokers, sink2)
	testenv.Eventually(t, 10*time.Second, "7 deliveries to the second member", func() bool { return sink2.count() == 7 })
	if got := sink2.deliveries()[0].ID; got != ds[3].ID {
		t.Errorf("second member starts at %s, want %s", got, ds[3].ID)
	}
}

// TestConsumerRedeliver: a record handed back is delivered again after
// the delay, and holds the commit point until settled.
func TestConsumerRedeliver(t *testing.T) {
	brokers := cluster(t, 1)
	produceN(t, brokers, 1)
	sink := newRecordingSink()
	var c *kafka.Consumer
	var mu sync.Mutex
	first := true
	sink.settle = func(d kafka.Delivery) {
		mu.Lock()
		defer mu.Unlock()
		if first {
			first = false
			c.Redeliver(200*time.Millisecond, d.ID)
			return
		}
		c.Settle(d.ID)
	}
	mu.Lock()
	c, _ = startConsumer(t, brokers, sink)
	mu.Unlock()
	testenv.Eventually(t, 10*time.Second, "redelivery", func() bool { return sink.count() == 2 })
	testenv.Eventually(t, 10*time.Second, "offset 1 committed", func() bool { return committed(t, brokers) == 1 })
}

// TestConsumersSharePartitions: two members split the partitions; every
// record is delivered, and all are committed once settled, through the
// rebalance that the second member's arrival causes.
func TestConsumersSharePartitions(t *testing.T) {
	brokers := cluster(t, 4)
	want := produceN(t, brokers, 200)
	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	members := map[string]map[int32]bool{}
	mk := func(name string) *recordingSink {
		s := newRecordingSink()
		var c *kafka.Consumer
		ready := make(chan struct{})
		s.settle = func(d kafka.Delivery) {
			<-ready
			_, p, _, _ := kafka.ParsePosition(d.ID)
			mu.Lock()
			seen[d.Value.TaskID]++
			if members[name] == nil {
				members[name] = map[int32]bool{}
			}
			members[name][p] = true
			mu.Unlock()
			time.Sleep(time.Millisecond) // a short handler
			c.Settle(d.ID)
		}
		c, _ = startConsumer(t, brokers, s)
		close(ready)
		return s
	}
	mk("a")
	mk("b")
	testenv.Eventually(t, 20*time.Second, "all records committed", func() bool { return committed(t, brokers) == 200 })
	mu.Lock()
	defer mu.Unlock()
	for id := range want {
		if seen[id] == 0 {
			t.Errorf("task %s never delivered", id)
		}
	}
	t.Logf("partitions per member: %v", fmt.Sprint(members))
}
