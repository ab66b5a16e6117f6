package maintenance_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/stream"
)

// TestRetentionTrimsPriorityStreams: retention trims the stream of every
// priority of a task stream, each below what the group still needs there.
func TestRetentionTrimsPriorityStreams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	r := b.retention(t, maintenance.RetentionConfig{})
	var want int64
	for _, p := range stream.Priorities {
		key := stream.Key(b.stream, p)
		if err := b.rdb.XGroupCreateMkStream(ctx, key, "g", "0").Err(); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []string{"task_id", "x", "kind", "k"}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// p entries delivered and acknowledged; the others still needed.
		s, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, ">"}, Count: int64(p)}).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range s[0].Messages {
			b.rdb.XAck(ctx, key, "g", m.ID)
		}
		want += int64(p)
	}
	res, err := r.RunOnce(ctx)
	if err != nil || res.Trimmed != want {
		t.Fatalf("RunOnce = %+v, %v; want %d trimmed", res, err, want)
	}
	for _, p := range stream.Priorities {
		if n, err := b.rdb.XLen(ctx, stream.Key(b.stream, p)).Result(); err != nil || n != int64(5-p) {
			t.Errorf("priority %d: %d entries left, %v; want %d", p, n, err, 5-p)
		}
	}
}
