package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
)

// TestRescuerReadsOutboxRowsByTask checks that the rescuer reaches a
// candidate's outbox rows through outbox_event_task_idx (task_id, id), in
// two states where the planner is tempted elsewhere: no statistics at all
// (it walked the primary key backwards, filtering on task_id: 23 ms per
// candidate with 200,000 rows), and statistics that make the claim index
// (unsent rows) look empty while a backlog is being relayed (it filtered
// that index on task_id: 6.6 s per page). Both are O(table) per candidate.
func TestRescuerReadsOutboxRowsByTask(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	exec := func(qs ...string) {
		t.Helper()
		for _, q := range qs {
			if _, err := db.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(state string) {
		for name, st := range outbox.RescueStatements() {
			nodes, plan := testenv.GenericPlan(t, db, st[0], st[1])
			for _, p := range nodes {
				if p.Relation == "outbox_event" && p.Index != "outbox_event_task_idx" {
					t.Errorf("%s, %s: reads outbox_event by %s %s, not by task:\n%s", state, name, p.NodeType, p.Index, plan)
				}
			}
		}
	}
	exec(`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
		  SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 3 FROM generate_series(1, 20000) g`,
		`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at)
		 SELECT id, 's', 'SENT', '1-1', now() FROM ingest_task`)
	check("no statistics")
	exec(`ANALYZE`, `INSERT INTO outbox_event (task_id, stream) SELECT id, 's' FROM ingest_task`)
	check("backlog after ANALYZE")
}

// TestRelayClaimReadsClaimIndexInOrder checks that a claim reads the claim
// index in order and stops after a batch, even when the statistics say
// there is nothing unsent (taken before a backlog arrived): without the
// planner settings sent with it, that estimate made each claim read and
// sort every unsent row.
func TestRelayClaimReadsClaimIndexInOrder(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	for _, q := range []string{
		`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
		 SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 3 FROM generate_series(1, 20000) g`,
		`ANALYZE`,
		`INSERT INTO outbox_event (task_id, stream) SELECT id, 's' FROM ingest_task`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	settings, claim := outbox.ClaimStatements()
	// The same round trip as the relay's: the settings, then the claim,
	// in one implicit transaction.
	batch := &pgx.Batch{}
	batch.Queue(settings)
	batch.Queue(`EXPLAIN (FORMAT JSON) `+claim, "r", 1000, 60000)
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	br := conn.SendBatch(ctx, batch)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	var plan []byte
	if err := br.QueryRow().Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	// The settings end with the claim's transaction: the pooled connection
	// plans everything else as usual.
	var bitmap, seq string
	if err := conn.QueryRow(ctx, `SELECT current_setting('enable_bitmapscan'), current_setting('enable_seqscan')`).Scan(&bitmap, &seq); err != nil {
		t.Fatal(err)
	}
	if bitmap != "on" || seq != "on" {
		t.Errorf("after a claim the connection has enable_bitmapscan=%s enable_seqscan=%s, want on, on", bitmap, seq)
	}
	nodes := testenv.ParsePlan(t, plan)
	var ordered bool
	for _, p := range nodes {
		if p.Relation != "outbox_event" {
			continue
		}
		switch {
		case p.NodeType == "Index Scan" && p.Index == "outbox_event_claim_idx":
			ordered = true
		case strings.Contains(p.NodeType, "Scan") && p.Index != "outbox_event_pkey":
			t.Errorf("claim reads outbox_event by %s %s:\n%s", p.NodeType, p.Index, plan)
		}
	}
	if !ordered {
		t.Errorf("claim does not read outbox_event_claim_idx in order:\n%s", plan)
	}
}
