package outbox

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/stream"
)

// Message is one outbox row to publish: the task it names and where it goes.
type Message struct {
	// Stream is the row's outbox_event.stream: the Redis stream key, or the
	// Kafka topic in Kafka mode.
	Stream string
	TaskID uuid.UUID
	Kind   string
	// Traceparent is the task's W3C trace context ("" when none): the
	// stream entry's traceparent field, the Kafka record's header.
	Traceparent string
}

// Publisher carries outbox rows to the transport that hands tasks to
// workers. Publish sends msgs (in one round trip where the transport can)
// and returns, for each message at the same index, the id the transport
// gave it (stored in outbox_event.stream_id) or its error. Both slices have
// len(msgs) entries. A message whose error is nil must be durably accepted
// by the transport; one with an error is retried by the relay with
// backoff. Publish must return once ctx is done.
type Publisher interface {
	Publish(ctx context.Context, msgs []Message) (ids []string, errs []error)
}

// RedisPublisher publishes each message as a task entry (stream.Entry) with
// XADD, all in one pipelined round trip; the ids are the entry ids.
type RedisPublisher struct {
	rdb redis.UniversalClient
}

// NewRedisPublisher returns a publisher on rdb.
func NewRedisPublisher(rdb redis.UniversalClient) *RedisPublisher { return &RedisPublisher{rdb: rdb} }

// Publish implements Publisher.
func (p *RedisPublisher) Publish(ctx context.Context, msgs []Message) ([]string, []error) {
	cmds := make([]*redis.StringCmd, len(msgs))
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, m := range msgs {
			cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{
				Stream: m.Stream,
				Values: stream.Entry{TaskID: m.TaskID, Kind: m.Kind, Traceparent: m.Traceparent}.Values(),
			})
		}
		return nil
	})
	ids := make([]string, len(msgs))
	errs := make([]error, len(msgs))
	for i, cmd := range cmds {
		ids[i], errs[i] = cmd.Result()
		if errs[i] != nil {
			errs[i] = fmt.Errorf("xadd %s: %w", msgs[i].Stream, errs[i])
		}
	}
	return ids, errs
}
