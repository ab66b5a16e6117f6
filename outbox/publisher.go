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
	// Priority is the task's priority (0 or 2: the default). A Publisher
	// that is a Router publishes to Route(Stream, Priority).
	Priority int
	// Grouped: the task has a group or a sequence. Its row is written to
	// outbox_row, never to the log: the refills of its group's window
	// and the releases of its sequence read and write a task's latest
	// row there.
	Grouped bool
}

// Router is a Publisher whose messages go to a destination that depends
// on their priority (Redis mode: a stream per priority). The relay records
// Route's destination as the published row's outbox_event.stream, so the
// row names the stream its entry is in. A Publisher that is no Router
// publishes every message to its Stream, whatever its priority (Kafka
// mode: one topic).
type Router interface {
	Route(stream string, priority int) string
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

// Route implements Router: the stream of the priority (stream.Key).
func (p *RedisPublisher) Route(base string, priority int) string { return stream.Key(base, priority) }

// Publish implements Publisher: each message goes to the stream of its
// priority (Route).
func (p *RedisPublisher) Publish(ctx context.Context, msgs []Message) ([]string, []error) {
	cmds := make([]*redis.StringCmd, len(msgs))
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, m := range msgs {
			cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{
				Stream: p.Route(m.Stream, m.Priority),
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
			errs[i] = fmt.Errorf("xadd %s: %w", p.Route(msgs[i].Stream, msgs[i].Priority), errs[i])
		}
	}
	return ids, errs
}
