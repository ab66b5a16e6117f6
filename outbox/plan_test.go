package outbox_test

import (
	"context"
	"testing"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
)

// TestRescuerReadsOutboxRowsByTask checks that the rescuer reaches a
// candidate's outbox rows through outbox_event_task_idx, under statistics
// that make the claim index (unsent rows) look empty while it is not: a
// backlog being relayed. Filtering the claim index on task_id instead is
// O(unsent rows) per candidate; one page of a 200,000-task backlog took
// 6.6 s that way.
func TestRescuerReadsOutboxRowsByTask(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	for _, q := range []string{
		`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
		 SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 3 FROM generate_series(1, 20000) g`,
		`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at)
		 SELECT id, 's', 'SENT', '1-1', now() FROM ingest_task`,
		`ANALYZE`,
		`INSERT INTO outbox_event (task_id, stream) SELECT id, 's' FROM ingest_task`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for name, st := range outbox.RescueStatements() {
		t.Run(name, func(t *testing.T) {
			nodes, plan := testenv.GenericPlan(t, db, st[0], st[1])
			for _, p := range nodes {
				if p.Relation == "outbox_event" && p.Index != "outbox_event_task_idx" {
					t.Errorf("%s reads outbox_event by %s %s, not by task:\n%s", name, p.NodeType, p.Index, plan)
				}
			}
		})
	}
}
