package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
)

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
