package task_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

// TestHotStatementsReadTasksByPrimaryKey checks the plans of the hot
// statements where the planner is most tempted to go wrong: statistics
// taken when every task was QUEUED, then every task moved to RUNNING
// (autovacuum off or behind, as on a busy queue), and the generic plan
// that a prepared statement ends up with. Each statement must reach
// ingest_task through its primary key only: an index on status would
// read every RUNNING task per statement (seconds, not milliseconds).
func TestHotStatementsReadTasksByPrimaryKey(t *testing.T) {
	b := setup(t, task.Config{})
	const n = 20000
	if _, err := b.db.Exec(b.ctx, `
INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 3 FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(b.ctx, `ANALYZE ingest_task`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET status = 'RUNNING', lease_owner = 'w', lease_until = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	for name, st := range task.HotStatements() {
		t.Run(name, func(t *testing.T) {
			nodes, plan := testenv.GenericPlan(t, b.db, st[0], st[1])
			for _, p := range nodes {
				if p.Relation != "ingest_task" {
					continue
				}
				switch {
				case strings.Contains(p.NodeType, "Seq Scan"):
					t.Errorf("%s scans ingest_task sequentially:\n%s", name, plan)
				case p.Index != "" && p.Index != "ingest_task_pkey":
					t.Errorf("%s reads ingest_task through %s, not its primary key:\n%s", name, p.Index, plan)
				}
			}
		})
	}
}

// TestRescuerReadsOutboxRowsByTask checks that the rescuer reads its
// candidates on the indexes of the unfinished tasks (the primary key from
// the low water and ingest_task_lingering_idx: liveTasks), sent with
// RescuePlanSQL as the code sends them, and reaches a
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
		for name, st := range task.RescueStatements() {
			nodes, plan := testenv.GenericPlanWith(t, db, task.RescuePlanSQL, st[0], st[1])
			lingering := false
			for _, p := range nodes {
				// outbox_event's rows, in outbox_row's partitions or in
				// the outbox log (whose batches and rounds are read by
				// their keys), are read by task.
				rowsTable := strings.HasPrefix(p.Relation, "outbox_") && p.Relation != "outbox_log_batch" && p.Relation != "outbox_log_round"
				if rowsTable && p.NodeType != "ModifyTable" && !strings.HasSuffix(p.Index, "task_idx") {
					t.Errorf("%s, %s: reads outbox_event by %s %s, not by task:\n%s", state, name, p.NodeType, p.Index, plan)
				}
				// The candidates come from the unfinished tasks only (the
				// re-check reads its tasks by primary key).
				if p.Relation == "ingest_task" && p.Index != "ingest_task_lingering_idx" && p.Index != "ingest_task_pkey" {
					t.Errorf("%s, %s: reads ingest_task by %s %s, not on the primary key or the lingering index:\n%s", state, name, p.NodeType, p.Index, plan)
				}
				lingering = lingering || p.Index == "ingest_task_lingering_idx"
				// No relation is scanned sequentially (the low water's
				// row included): under RescuePlanSQL such a scan costs the
				// setting's penalty, and the plan JIT compilation.
				if strings.Contains(p.NodeType, "Seq Scan") {
					t.Errorf("%s, %s: scans %s sequentially:\n%s", state, name, p.Relation, plan)
				}
			}
			if name != "still-missing" && !lingering {
				t.Errorf("%s, %s: does not read the lingering tasks on their index:\n%s", state, name, plan)
			}
		}
	}
	// Mostly finished tasks, as on a server that has worked for a while.
	exec(`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, status, finished_at)
		  SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 3,
		         CASE WHEN g % 100 = 0 THEN 'QUEUED' ELSE 'SUCCEEDED' END, CASE WHEN g % 100 = 0 THEN NULL ELSE now() END
		  FROM generate_series(1, 20000) g`,
		`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at)
		 SELECT id, 's', 'SENT', '1-1', now() FROM ingest_task`)
	check("no statistics")
	exec(`ANALYZE`, `INSERT INTO outbox_event (task_id, stream) SELECT id, 's' FROM ingest_task`,
		`INSERT INTO outbox_log (task_id, stream) SELECT id, 's' FROM ingest_task`)
	check("backlog after ANALYZE")
}

// TestParkedStatementsReadTheParkedIndex: whether a kind has parked tasks
// (asked after every run of a concurrency-limited kind) and which to
// release are read on ingest_task_parked_idx, whose predicate is the
// parked guard, not by a scan of the kind's tasks, most of which are not
// parked; once, and the released rows by primary key (a lookup by id on
// the parked index reads every parked task of every kind, per row).
func TestParkedStatementsReadTheParkedIndex(t *testing.T) {
	b := setup(t, task.Config{})
	if _, err := b.db.Exec(b.ctx, `
INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, parked_at)
SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 3, CASE WHEN g % 1000 = 0 THEN now() END FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(b.ctx, `ANALYZE ingest_task`); err != nil {
		t.Fatal(err)
	}
	for name, st := range task.ParkedStatements() {
		nodes, plan := testenv.GenericPlan(t, b.db, st[0], st[1])
		parkedScans := 0
		for _, p := range nodes {
			if p.Relation != "ingest_task" || p.NodeType == "ModifyTable" {
				continue
			}
			switch p.Index {
			case "ingest_task_parked_idx":
				parkedScans++
			case "ingest_task_pkey": // the update's target rows, by id
			default:
				t.Errorf("%s reads ingest_task by %s %s:\n%s", name, p.NodeType, p.Index, plan)
			}
		}
		if parkedScans != 1 {
			t.Errorf("%s reads ingest_task_parked_idx %d times, want once:\n%s", name, parkedScans, plan)
		}
	}
}

// TestRetentionReadsByKey checks that the deletion of finished tasks
// reaches every table by key: the candidates on the primary key (a range
// of ids below the UUIDv7 of the cutoff), their audit rows on the audit
// table's primary key and their outbox rows on outbox_event_task_idx.
// Reading any of them sequentially would make a batch O(table), holding
// its locks that long.
func TestRetentionReadsByKey(t *testing.T) {
	b := setup(t, task.Config{})
	for _, q := range []string{
		`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, status, finished_at)
		 SELECT gen_random_uuid(), 'plan', '{}', md5(g::text), 3,
		        CASE WHEN g % 10 = 0 THEN 'QUEUED' ELSE 'SUCCEEDED' END, CASE WHEN g % 10 = 0 THEN NULL ELSE now() END
		 FROM generate_series(1, 20000) g`,
		`INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count)
		 SELECT id, NULL, 'QUEUED', 0 FROM ingest_task`,
		`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at)
		 SELECT id, 's', 'SENT', '1-1', now() FROM ingest_task`,
		`ANALYZE`,
	} {
		if _, err := b.db.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// The settings of task.RescuePlanSQL, which DeleteExpired sends first.
	cfg := b.db.Config()
	cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	cfg.ConnConfig.RuntimeParams["enable_bitmapscan"] = "off"
	db, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The audit table is read in each of its partitions, each by its
	// primary key (<partition>_pkey; ingest_task_transition_pkey on the
	// partition of the rows from before the partitioning). Retention's
	// batches leave the audit rows to their partition; an operator's
	// delete takes them with the task.
	// The outbox is read (expired) or deleted from (terminal) in each of
	// its partitions by task, on <partition>_task_idx.
	audit := auditPartitions(t, b.db)
	index := map[string]string{"ingest_task": "ingest_task_pkey"}
	for _, p := range audit {
		index[p] = p + "_pkey"
	}
	index["ingest_task_transition_history"] = "ingest_task_transition_pkey"
	outboxParts := outboxPartitions(t, b.db)
	for _, p := range outboxParts {
		index[p] = p + "_task_idx"
	}
	for name, tables := range map[string][]string{
		"expired":  append([]string{"ingest_task"}, outboxParts...),
		"terminal": append(append([]string{"ingest_task"}, outboxParts...), audit...),
	} {
		st := task.RetentionStatements()[name]
		nodes, plan := testenv.GenericPlan(t, db, st[0], st[1])
		// Probes by task, never a join over a whole partition's index.
		if bad := testenv.TableReads(nodes, "outbox_event"); len(bad) > 0 {
			t.Errorf("%s reads the outbox whole: %v:\n%s", name, bad, plan)
		}
		seen := map[string]bool{}
		for _, p := range nodes {
			idx, ok := index[p.Relation]
			if !ok {
				if p.Relation == "ingest_task_transition" && p.NodeType == "ModifyTable" {
					seen[p.Relation] = true
				}
				continue
			}
			seen[p.Relation] = true
			if p.NodeType != "ModifyTable" && p.Index != idx {
				t.Errorf("%s reads %s by %s %s, not %s:\n%s", name, p.Relation, p.NodeType, p.Index, idx, plan)
			}
		}
		for _, tb := range tables {
			if !seen[tb] {
				t.Errorf("%s: plan does not read %s (reads %v):\n%s", name, tb, seen, plan)
			}
		}
		if name == "expired" && seen["ingest_task_transition"] {
			t.Errorf("expired: plan deletes audit rows:\n%s", plan)
		}
	}
}

// TestHotPathKeepsIndexPathsNeverAnalyzed checks the plan of every
// statement of a task's way from creation to completion on a database
// whose tables were never analyzed (freshly migrated, restored or
// truncated), as each is sent (with its planner settings): while the
// tables are empty, when the planner assumes ten pages and a prepared
// statement settles on the generic plan that it then keeps as the table
// grows (a start planned there as a hash join over a sequential scan of
// ingest_task held a queue of 500 tasks/s back for 30 s, until autovacuum
// analyzed the table), and after ingest_task has grown to 10,000 tasks
// without an ANALYZE. No statement may read ingest_task, its audit or
// outbox rows by a sequential scan or a hash or merge join over them.
// The statements sent with settings are also checked on tables analyzed
// while empty (a VACUUM of an emptied table), where the planner assumes
// none.
func TestHotPathKeepsIndexPathsNeverAnalyzed(t *testing.T) {
	db := testenv.NeverAnalyzed(t)
	tables := append([]string{"ingest_task", "ingest_task_transition", "outbox_event"}, auditPartitions(t, db)...)
	testenv.CheckIndexPaths(t, db, "never analyzed, empty", task.HotPathStatements(), tables...)
	testenv.GrowTasks(t, db, 10000)
	testenv.CheckIndexPaths(t, db, "never analyzed, 10,000 tasks", task.HotPathStatements(), tables...)

	withSettings := map[string][3]string{}
	for name, st := range task.HotPathStatements() {
		if st[0] != "" {
			withSettings[name] = st
		}
	}
	db = testenv.DB(t)
	tables = append([]string{"ingest_task", "ingest_task_transition", "outbox_event"}, auditPartitions(t, db)...)
	if _, err := db.Exec(context.Background(), `VACUUM ANALYZE`); err != nil {
		t.Fatal(err)
	}
	testenv.CheckIndexPaths(t, db, "analyzed while empty", withSettings, tables...)
}

// auditPartitions names the partitions of the audit table, whose scans
// plans show under their own names.
func outboxPartitions(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	parts, _, _, err := outbox.Partitions(context.Background(), db)
	if err != nil || len(parts) == 0 {
		t.Fatalf("outbox partitions %v, %v", parts, err)
	}
	var out []string
	for _, p := range parts {
		out = append(out, p.Name)
	}
	return out
}

func auditPartitions(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	parts, _, err := transition.Partitions(context.Background(), db)
	if err != nil || len(parts) == 0 {
		t.Fatalf("audit partitions %v, %v", parts, err)
	}
	var out []string
	for _, p := range parts {
		out = append(out, p.Name)
	}
	return out
}
