package outbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
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
	batch.Queue(`EXPLAIN (FORMAT JSON) `+claim, 1000, "-infinity")
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
	// Each partition is read on its own claim index (<partition>_claim_idx),
	// in order, under a Merge Append.
	for _, p := range nodes {
		if testenv.Table(p.Relation) != "outbox_event" {
			continue
		}
		switch {
		case p.NodeType == "Index Scan" && p.Index == p.Relation+"_claim_idx":
			ordered = true
		case strings.Contains(p.NodeType, "Scan") && p.Index != p.Relation+"_pkey":
			t.Errorf("claim reads %s by %s %s:\n%s", p.Relation, p.NodeType, p.Index, plan)
		}
	}
	if !ordered {
		t.Errorf("claim does not read outbox_event_claim_idx in order:\n%s", plan)
	}
}

// TestHotPathKeepsIndexPathsNeverAnalyzed checks the plan of every
// statement that publishes a task on a database whose tables were never
// analyzed (freshly migrated, restored or truncated), as the relay sends
// it: while the tables are empty (the planner assumes ten pages, and a
// prepared statement keeps the generic plan it makes there as the table
// grows) and after 10,000 tasks were added without an ANALYZE. None may
// read outbox_event or ingest_task by a sequential scan or a hash or
// merge join over them (the marking of published rows was a hash join
// over every outbox row).
func TestHotPathKeepsIndexPathsNeverAnalyzed(t *testing.T) {
	db := testenv.NeverAnalyzed(t)
	testenv.CheckIndexPaths(t, db, "never analyzed, empty", outbox.HotPathStatements(), "outbox_event", "ingest_task")
	testenv.GrowTasks(t, db, 10000)
	testenv.CheckIndexPaths(t, db, "never analyzed, 10,000 tasks", outbox.HotPathStatements(), "outbox_event", "ingest_task")
}

// TestHoldReadsItsTasksByID checks that ingest_task_hold_due reads the
// tasks it is given through the primary key and counts their groups'
// windows on the group index, on a never-analyzed table that holds many
// finished tasks of another group: the buffers a call touches do not grow
// with them. Its first version read every unfinished task with a group
// (a scan of the group index, whose predicate its conditions matched).
func TestHoldReadsItsTasksByID(t *testing.T) {
	ctx := context.Background()
	db := testenv.NeverAnalyzed(t)
	buffers := func() int64 {
		var ids []uuid.UUID
		if err := db.QueryRow(ctx, `SELECT array_agg(id) FROM ingest_task WHERE group_key = 'quiet'`).Scan(&ids); err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		var plan []byte
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT ingest_task_hold_due($1::uuid[])`, ids).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		var out []struct {
			Plan struct {
				Hit  int64 `json:"Shared Hit Blocks"`
				Read int64 `json:"Shared Read Blocks"`
			}
		}
		if err := json.Unmarshal(plan, &out); err != nil || len(out) != 1 {
			t.Fatalf("EXPLAIN output %s: %v", plan, err)
		}
		return out[0].Plan.Hit + out[0].Plan.Read
	}
	// 100 delayed tasks of group quiet, fallen due, in a window of 100.
	if _, err := db.Exec(ctx, `INSERT INTO ingest_task (id, kind, payload, payload_sha, group_key, next_retry_at, due_at)
		SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 'quiet', now() - interval '1 second', now() - interval '1 second'
		FROM generate_series(1, 100) g`); err != nil {
		t.Fatal(err)
	}
	buffers() // the function's first call plans its statements
	small := buffers()
	if _, err := db.Exec(ctx, `INSERT INTO ingest_task (id, kind, payload, payload_sha, group_key, status, finished_at)
		SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 'busy', 'SUCCEEDED', now() FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	buffers()
	large := buffers()
	t.Logf("buffers of a call over 100 tasks: %d beside them alone, %d beside 50,000 of another group", small, large)
	// The primary key's extra level adds a buffer per task read; reading
	// the other group's tasks adds thousands.
	if large > 3*small {
		t.Errorf("a call over 100 tasks touched %d buffers beside 50,000 tasks of another group, %d without them: it reads more than its tasks and their group", large, small)
	}
}

// TestDeadCountReadsDeadIndex checks that the count of DEAD rows (ReadStats,
// the CLI's pending) reads each partition that holds rows on its own
// DEAD index (<partition>_dead_idx, migration 00037), never its heap
// whole: there was no such index, and the count scanned every partition
// of the table for its few DEAD rows. It holds on a database never
// analyzed and on one analyzed, where a partition without rows may be
// scanned (an empty table is read for nothing).
func TestDeadCountReadsDeadIndex(t *testing.T) {
	ctx := context.Background()
	db := testenv.NeverAnalyzed(t)
	testenv.GrowTasks(t, db, 10000)
	// One row in a thousand DEAD, the sent and the unsent ones alike (in
	// both partitions that hold rows).
	if _, err := db.Exec(ctx, `UPDATE outbox_event SET status = 'DEAD', attempt_count = 5, last_error = 'boom',
		next_retry_at = NULL, stream_id = NULL, sent_at = NULL WHERE id % 1000 = 0`); err != nil {
		t.Fatal(err)
	}
	// The partitions that hold rows, and the DEAD rows in all.
	rows, err := db.Query(ctx, `SELECT name FROM outbox_event_partitions()`)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var dead, holding int64
	held := map[string]bool{}
	for _, part := range parts {
		var n, d int64
		if err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'DEAD') FROM `+pgx.Identifier{part}.Sanitize()).Scan(&n, &d); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			held[part] = true
			holding++
		}
		dead += d
	}
	if holding < 2 || dead == 0 {
		t.Fatalf("%d DEAD rows, in partitions %v: want rows in two partitions at least", dead, held)
	}
	check := func(state string) {
		t.Helper()
		nodes, plan := testenv.GenericPlan(t, db, outbox.DeadCountStatement(), "")
		read := map[string]bool{}
		for _, p := range nodes {
			if testenv.Table(p.Relation) != "outbox_event" || !strings.Contains(p.NodeType, "Scan") {
				continue
			}
			// A bitmap scan names its index in its one child.
			index := p.Index
			if p.NodeType == "Bitmap Heap Scan" && len(p.Plans) == 1 {
				index = p.Plans[0].Index
			}
			switch {
			case index == p.Relation+"_dead_idx":
				read[p.Relation] = true
			case held[p.Relation]:
				t.Errorf("%s: the DEAD count reads %s by %s %s:\n%s", state, p.Relation, p.NodeType, index, plan)
			}
		}
		for part := range held {
			if !read[part] {
				t.Errorf("%s: the DEAD count does not read %s_dead_idx:\n%s", state, part, plan)
			}
		}
		s, err := outbox.ReadStats(ctx, db)
		if err != nil || s.Dead != dead {
			t.Errorf("%s: ReadStats = %+v, %v; want %d DEAD rows", state, s, err, dead)
		}
	}
	check("never analyzed")
	if _, err := db.Exec(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	check("analyzed")
}
