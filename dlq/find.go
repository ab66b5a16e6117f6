package dlq

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// FindTask returns the entries of task taskID among the newest limit
// entries of the DLQ stream key, newest first, and how many entries it
// searched (task show, the dashboard's task page).
func FindTask(ctx context.Context, rdb redis.UniversalClient, key, taskID string, limit int) ([]Entry, int, error) {
	var found []Entry
	scanned, after := 0, ""
	for scanned < limit {
		page, err := List(ctx, rdb, key, ListParams{Count: 1000, Newest: true, After: after})
		if err != nil {
			return found, scanned, err
		}
		for _, e := range page {
			if e.TaskID == taskID {
				found = append(found, e)
			}
		}
		scanned += len(page)
		if len(page) < 1000 {
			break
		}
		after = page[len(page)-1].ID
	}
	return found, scanned, nil
}
