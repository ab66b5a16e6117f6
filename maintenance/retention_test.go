package maintenance_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/maintenance"
)

func (b *bundle) retention(t *testing.T, cfg maintenance.RetentionConfig) *maintenance.Retention {
	t.Helper()
	if cfg.Streams == nil {
		cfg.Streams = []string{b.stream}
	}
	r, err := maintenance.NewRetention(cfg, b.db, b.rdb, b.reg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRetentionTrimNeverDropsPendingOrUndelivered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	r := b.retention(t, maintenance.RetentionConfig{})

	// No stream, then a stream without groups: nothing to trim.
	if res, err := r.RunOnce(ctx); err != nil || res.Trimmed != 0 {
		t.Fatalf("missing stream: %+v, %v", res, err)
	}
	ids := make([]string, 10)
	for i := range ids {
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: []string{"task_id", "x", "kind", "k"}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	if res, err := r.RunOnce(ctx); err != nil || res.Trimmed != 0 {
		t.Fatalf("stream without groups: %+v, %v", res, err)
	}

	read := func(g string, n int64) []string {
		t.Helper()
		s, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: g, Consumer: "c", Streams: []string{b.stream, ">"}, Count: n}).Result()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range s[0].Messages {
			got = append(got, m.ID)
		}
		return got
	}
	for _, g := range []string{"g1", "g2"} {
		if err := b.rdb.XGroupCreate(ctx, b.stream, g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Both groups created, nothing delivered: everything is needed.
	if res, err := r.RunOnce(ctx); err != nil || res.Trimmed != 0 {
		t.Fatalf("nothing delivered: %+v, %v", res, err)
	}
	// g1: 1..6 delivered, 1..3 acked: 4..6 pending, 7..10 undelivered.
	// g2: 1..8 delivered and acked: 9..10 undelivered.
	read("g1", 6)
	b.rdb.XAck(ctx, b.stream, "g1", ids[0], ids[1], ids[2])
	b.rdb.XAck(ctx, b.stream, "g2", read("g2", 8)...)

	remaining := func() []string {
		t.Helper()
		msgs, err := b.rdb.XRange(ctx, b.stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range msgs {
			got = append(got, m.ID)
		}
		return got
	}
	check := func(step string, wantTrimmed int64, want []string) {
		t.Helper()
		res, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := remaining()
		if res.Trimmed != wantTrimmed || len(got) != len(want) || got[0] != want[0] {
			t.Fatalf("%s: trimmed %d, left %v; want %d trimmed, left %v", step, res.Trimmed, got, wantTrimmed, want)
		}
	}
	check("g1 pending from 4", 3, ids[3:])

	// g1 acks 4..6 and reads 7..9 (pending): g2's undelivered 9 is the
	// lowest need... but g1's pending 7 is lower.
	b.rdb.XAck(ctx, b.stream, "g1", ids[3], ids[4], ids[5])
	read("g1", 3)
	check("g1 pending from 7", 3, ids[6:])

	// g1 acks everything and reads 10: g2 has not had 9 yet.
	b.rdb.XAck(ctx, b.stream, "g1", ids[6], ids[7], ids[8])
	b.rdb.XAck(ctx, b.stream, "g1", read("g1", 10)...)
	check("g2 undelivered from 9", 2, ids[8:])

	// g2 takes 9 and 10 and acks 9: 10 is pending for g2.
	got := read("g2", 2)
	b.rdb.XAck(ctx, b.stream, "g2", got[0])
	check("g2 pending 10", 1, ids[9:])
}
