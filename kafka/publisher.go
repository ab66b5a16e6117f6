package kafka

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/outbox"
)

// Publisher publishes outbox rows as task records (outbox.Publisher): one
// ProduceSync per batch, bounded by a timeout. A record's id is its
// position (RecordID).
type Publisher struct {
	cl      *kgo.Client
	timeout time.Duration
}

// NewPublisher returns a publisher on cl whose produce calls give up after
// timeout (<= 0: DefaultProduceTimeout). The caller closes cl.
func NewPublisher(cl *kgo.Client, timeout time.Duration) *Publisher {
	if timeout <= 0 {
		timeout = DefaultProduceTimeout
	}
	return &Publisher{cl: cl, timeout: timeout}
}

// Publish implements outbox.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) ([]string, []error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	recs := make([]*kgo.Record, len(msgs))
	index := make(map[*kgo.Record]int, len(msgs))
	for i, m := range msgs {
		recs[i] = Record(m.Stream, Value{TaskID: m.TaskID, Kind: m.Kind, Traceparent: m.Traceparent})
		index[recs[i]] = i
	}
	results := p.cl.ProduceSync(ctx, recs...)
	ids := make([]string, len(msgs))
	errs := make([]error, len(msgs))
	for i := range errs {
		errs[i] = fmt.Errorf("produce to %s: no result", msgs[i].Stream)
	}
	// ProduceSync returns one result per record in the order they
	// completed, not the order given: match them by record.
	for _, r := range results {
		i, ok := index[r.Record]
		if !ok {
			continue
		}
		errs[i] = nil
		if r.Err != nil {
			errs[i] = fmt.Errorf("produce to %s: %w", msgs[i].Stream, r.Err)
			continue
		}
		ids[i] = RecordID(r.Record)
	}
	return ids, errs
}
