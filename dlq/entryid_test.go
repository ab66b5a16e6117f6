package dlq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
)

func TestValidEntryID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]bool{
		"1718000000000-0": true, "0-1": true, "1718000000000": true, "18446744073709551615-18446744073709551615": true,
		"": false, "-": false, "1-": false, "-1": false, "abc": false, "1-2-3": false, "1.5-0": false, "+1-0": false,
		"18446744073709551616-0": false, "1-0\x00": false, "(1-0": false, " 1-0": false,
	} {
		if got := dlq.ValidEntryID(id); got != want {
			t.Errorf("ValidEntryID(%q) = %v, want %v", id, got, want)
		}
	}
}

// TestBadEntryIDs: an id that is no stream entry id is reported as not
// found by Replay and refused by List, instead of Redis's error (which the
// dashboard answered with a 500 and the CLI with exit 1).
func TestBadEntryIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	_, key := testenv.Keys(t)
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"task_id", "x"}}).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := dlq.Replay(ctx, rdb, key, nil, "operator", "garbage", "1-0\x00", "")
	if err != nil {
		t.Fatalf("Replay of bad ids: %v", err)
	}
	for _, r := range res {
		if r.Outcome != dlq.EntryNotFound {
			t.Errorf("entry %q: %s, want %s", r.EntryID, r.Outcome, dlq.EntryNotFound)
		}
	}
	if _, err := dlq.List(ctx, rdb, key, dlq.ListParams{After: "garbage"}); !errors.Is(err, dlq.ErrBadEntryID) {
		t.Fatalf("List after garbage: %v, want ErrBadEntryID", err)
	}
}
