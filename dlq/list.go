package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/clip"
)

// Listing limits.
const (
	DefaultListCount = 100
	MaxListCount     = 10000
)

// ListParams selects a page of DLQ entries.
type ListParams struct {
	// Count is the most entries returned: 1..MaxListCount, 0 means
	// DefaultListCount.
	Count int64
	// Newest lists newest first (XREVRANGE) instead of oldest first.
	Newest bool
	// After continues a listing after this entry id (exclusive; "" starts
	// at the oldest, or the newest with Newest).
	After string
}

// List returns DLQ entries of the stream key (XRANGE, or XREVRANGE with
// Newest). A missing key is an empty DLQ.
func List(ctx context.Context, rdb redis.UniversalClient, key string, p ListParams) ([]Entry, error) {
	if key == "" {
		return nil, errors.New("dlq list: no DLQ stream key")
	}
	if p.Count == 0 {
		p.Count = DefaultListCount
	}
	if p.Count < 1 || p.Count > MaxListCount {
		return nil, fmt.Errorf("dlq list: Count must be between 1 and %d, got %d", MaxListCount, p.Count)
	}
	if p.After != "" && !ValidEntryID(p.After) {
		return nil, fmt.Errorf("%w: after %q is not a stream entry id (MS-SEQ)", ErrBadEntryID, clip.String(p.After, 64))
	}
	var msgs []redis.XMessage
	var err error
	if p.Newest {
		end := "+"
		if p.After != "" {
			end = "(" + p.After
		}
		msgs, err = rdb.XRevRangeN(ctx, key, end, "-", p.Count).Result()
	} else {
		start := "-"
		if p.After != "" {
			start = "(" + p.After
		}
		msgs, err = rdb.XRangeN(ctx, key, start, "+", p.Count).Result()
	}
	if err != nil {
		return nil, fmt.Errorf("list dlq %s: %w", key, err)
	}
	out := make([]Entry, len(msgs))
	for i, m := range msgs {
		out[i] = parse(m)
	}
	return out, nil
}

// Get returns one DLQ entry, and false when the key has no entry id.
func Get(ctx context.Context, rdb redis.UniversalClient, key, id string) (Entry, bool, error) {
	msgs, err := rdb.XRangeN(ctx, key, id, id, 1).Result()
	if err != nil {
		return Entry{}, false, fmt.Errorf("read dlq %s entry %s: %w", key, id, err)
	}
	if len(msgs) == 0 {
		return Entry{}, false, nil
	}
	return parse(msgs[0]), true, nil
}

// parse reads an entry leniently: a field missing or malformed is left at
// its zero value.
func parse(m redis.XMessage) Entry {
	get := func(f string) string { s, _ := m.Values[f].(string); return s }
	e := Entry{
		ID:        m.ID,
		TaskID:    get(FieldTaskID),
		Kind:      get(FieldKind),
		LastError: get(FieldLastError),
		SourceID:  get(FieldSourceID),
	}
	e.AttemptCount, _ = strconv.Atoi(get(FieldAttemptCount))
	e.DeadAt, _ = time.Parse(time.RFC3339, get(FieldDeadAt))
	return e
}
