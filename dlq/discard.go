package dlq

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Discarded is what Discard did with one entry id.
type Discarded struct {
	EntryID string `json:"entry_id"`
	// TaskID is the entry's task_id field ("" for an entry that was not
	// found or has none).
	TaskID string `json:"task_id,omitempty"`
	// Removed: the entry is gone. False: there was no such entry (or the
	// id is not an entry id, see ValidEntryID).
	Removed bool `json:"removed"`
}

// Discard removes the entries entryIDs from the DLQ stream key and leaves
// their tasks as they are (a DEAD task stays DEAD, without an entry): an
// operator's way to drop a death that needs no redrive. RemoveTasks removes
// the entries of given tasks instead.
func Discard(ctx context.Context, rdb redis.UniversalClient, key string, entryIDs ...string) ([]Discarded, error) {
	out := make([]Discarded, 0, len(entryIDs))
	for _, id := range entryIDs {
		d := Discarded{EntryID: id}
		if !ValidEntryID(id) {
			out = append(out, d)
			continue
		}
		msgs, err := rdb.XRangeN(ctx, key, id, id, 1).Result()
		if err != nil {
			return out, fmt.Errorf("dlq %s: read entry %s: %w", key, id, err)
		}
		if len(msgs) == 1 {
			d.TaskID, _ = msgs[0].Values[FieldTaskID].(string)
		}
		n, err := rdb.XDel(ctx, key, id).Result()
		if err != nil {
			return out, fmt.Errorf("dlq %s: discard entry %s: %w", key, id, err)
		}
		d.Removed = n == 1
		out = append(out, d)
	}
	return out, nil
}
