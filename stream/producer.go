package stream

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Message is one task entry to add.
type Message struct {
	TaskID uuid.UUID
	Kind   string
}

// Producer adds task entries {task_id, kind} to the task stream.
type Producer struct {
	stream string
	rdb    redis.UniversalClient
}

// NewProducer returns a producer for the stream key (DefaultStream when
// empty).
func NewProducer(streamKey string, rdb redis.UniversalClient) (*Producer, error) {
	if streamKey == "" {
		streamKey = DefaultStream
	}
	if rdb == nil {
		return nil, errors.New("stream: nil redis client")
	}
	return &Producer{stream: streamKey, rdb: rdb}, nil
}

// Add appends one entry and returns its id.
func (p *Producer) Add(ctx context.Context, m Message) (string, error) {
	id, err := p.rdb.XAdd(ctx, p.args(m)).Result()
	if err != nil {
		return "", fmt.Errorf("xadd %s task %s: %w", p.stream, m.TaskID, err)
	}
	return id, nil
}

// AddBatch appends entries in one pipeline and returns their ids in order.
// On error some entries may have been added (at-least-once: starting a task
// is a guarded transition, so a repeat is harmless).
func (p *Producer) AddBatch(ctx context.Context, ms ...Message) ([]string, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ms))
	for i, m := range ms {
		cmds[i] = pipe.XAdd(ctx, p.args(m))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("xadd %s %d tasks: %w", p.stream, len(ms), err)
	}
	ids := make([]string, len(ms))
	for i, c := range cmds {
		ids[i] = c.Val()
	}
	return ids, nil
}

func (p *Producer) args(m Message) *redis.XAddArgs {
	return &redis.XAddArgs{Stream: p.stream, Values: []string{FieldTaskID, m.TaskID.String(), FieldKind, m.Kind}}
}
