package stream

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// EntryState is what Redis holds about one stream entry: whether it is
// still in the stream and whether it is pending in the group (delivered,
// not acknowledged), with which consumer, idle how long, delivered how
// many times (task show, the dashboard's task page).
type EntryState struct {
	ID         string `json:"id"`
	Stream     string `json:"stream"`
	InStream   bool   `json:"in_stream"`
	Pending    bool   `json:"pending"`
	Consumer   string `json:"consumer,omitempty"`
	IdleMS     int64  `json:"idle_ms,omitempty"`
	Deliveries int64  `json:"deliveries,omitempty"`
}

// InspectEntry reads the state of entry id of stream in group (XRANGE and
// XPENDING of that one id); a missing group leaves it not pending.
func InspectEntry(ctx context.Context, rdb redis.UniversalClient, stream, group, id string) (EntryState, error) {
	e := EntryState{ID: id, Stream: stream}
	msgs, err := rdb.XRangeN(ctx, stream, id, id, 1).Result()
	if err != nil {
		return e, fmt.Errorf("xrange %s: %w", stream, err)
	}
	e.InStream = len(msgs) > 0
	pend, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: group, Start: id, End: id, Count: 1}).Result()
	if err != nil && !IsNoGroup(err) {
		return e, fmt.Errorf("xpending %s %s: %w", stream, group, err)
	}
	if len(pend) > 0 {
		e.Pending, e.Consumer, e.IdleMS, e.Deliveries = true, pend[0].Consumer, pend[0].Idle.Milliseconds(), pend[0].RetryCount
	}
	return e, nil
}
