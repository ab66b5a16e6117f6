package stream_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
)

// TestForget: the entries given leave the pending entries list of every
// group of their stream and the stream itself, whether they were pending
// or not yet delivered; other entries stay as they were, and entries of a
// stream that does not exist, or that are gone already, are skipped.
func TestForget(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, _ := testenv.Keys(t)
		for _, g := range []string{"g1", "g2"} {
			if err := b.Client.XGroupCreateMkStream(ctx, key, g, "0").Err(); err != nil {
				t.Fatal(err)
			}
		}
		ids := add(t, b.Client, key, newEntry("a"), newEntry("b"), newEntry("c"))
		// Group g1 has all three pending; g2 has the first pending and the
		// others undelivered.
		read := func(group string, count int64) {
			t.Helper()
			if err := b.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c",
				Streams: []string{key, ">"}, Count: count, Block: -1}).Err(); err != nil {
				t.Fatalf("read %s: %v", group, err)
			}
		}
		read("g1", 10)
		read("g2", 1)

		forget := []stream.EntryRef{{Stream: key, ID: ids[0]}, {Stream: key, ID: ids[1]},
			{Stream: key, ID: "1-1"}, {Stream: key + ":none", ID: ids[0]}}
		n, err := stream.Forget(ctx, b.Client, forget)
		if err != nil || n != 2 {
			t.Fatalf("Forget = %d, %v; want 2 entries deleted", n, err)
		}
		msgs, err := b.Client.XRange(ctx, key, "-", "+").Result()
		if err != nil || len(msgs) != 1 || msgs[0].ID != ids[2] {
			t.Errorf("stream after Forget: %v, %v; want only %s", msgs, err, ids[2])
		}
		for group, want := range map[string][]string{"g1": {ids[2]}, "g2": nil} {
			ps, err := b.Client.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: group, Start: "-", End: "+", Count: 10}).Result()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.ID)
			}
			if len(got) != len(want) || (len(want) > 0 && got[0] != want[0]) {
				t.Errorf("%s pending after Forget: %v, want %v", group, got, want)
			}
		}
		// g2 reads what is left: the entry kept, not the one forgotten
		// before it was delivered.
		res, err := b.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g2", Consumer: "c",
			Streams: []string{key, ">"}, Count: 10, Block: -1}).Result()
		if err != nil || len(res) != 1 || len(res[0].Messages) != 1 || res[0].Messages[0].ID != ids[2] {
			t.Errorf("g2 reads %v, %v; want only %s", res, err, ids[2])
		}
		if n, err := stream.Forget(ctx, b.Client, nil); n != 0 || err != nil {
			t.Errorf("Forget(nil) = %d, %v", n, err)
		}
	})
}

// TestIsMissing runs the commands whose "does not exist" answers the
// callers treat as an empty stream, against each Redis backend, and checks
// that IsMissing recognises each answer and nothing else.
func TestIsMissing(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, _ := testenv.Keys(t)
		_, noStream := b.Client.XInfoGroups(ctx, key).Result()
		if !stream.IsNoStream(noStream) || !stream.IsMissing(noStream) {
			t.Errorf("XINFO GROUPS of a missing stream: %v not recognised", noStream)
		}
		if err := b.Client.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []string{"f", "v"}}).Err(); err != nil {
			t.Fatal(err)
		}
		_, noGroup := b.Client.XInfoConsumers(ctx, key, "nogroup").Result()
		if !stream.IsMissing(noGroup) {
			t.Errorf("XINFO CONSUMERS of a missing group: %v not recognised", noGroup)
		}
		if err := b.Client.Set(ctx, key+"-string", "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		_, wrongType := b.Client.XInfoGroups(ctx, key+"-string").Result()
		if wrongType == nil || stream.IsMissing(wrongType) {
			t.Errorf("XINFO GROUPS of a string key: %v taken for a missing stream", wrongType)
		}
		if stream.IsMissing(nil) {
			t.Error("stream.IsMissing(nil) = true")
		}
	})
}
