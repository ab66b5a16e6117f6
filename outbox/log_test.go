package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/outbox"
)

// logCounts returns how many rows the outbox log holds, and how many of
// them outbox_event shows SENT with the entry id under which the stream
// holds their task.
func (b *bundle) logCounts(t *testing.T) (rows, sentWithEntry int) {
	t.Helper()
	entries := b.entries(t)
	q, err := b.db.Query(context.Background(), `
		SELECT e.task_id::text, e.status, coalesce(e.stream_id, '')
		FROM outbox_event e JOIN outbox_log l ON l.id = e.id`)
	if err != nil {
		t.Fatal(err)
	}
	var taskID, status, streamID string
	if _, err := pgx.ForEachRow(q, []any{&taskID, &status, &streamID}, func() error {
		rows++
		if status == "SENT" && entries[streamID] == taskID {
			sentWithEntry++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rows, sentWithEntry
}

// TestLogPublishesInCommitOrder: the rows of created tasks are appended
// to the outbox log; a transaction that wrote its rows first and commits
// after a pass has its rows published by the next pass, and every row is
// published once, shown SENT by outbox_event with its own entry id.
func TestLogPublishesInCommitOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)

	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	late := uuid.Must(uuid.NewV7())
	if _, err := tx.Exec(ctx, `INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts) VALUES ($1, 'late', '{}', 'x', 3)`, late); err != nil {
		t.Fatal(err)
	}
	if err := outbox.InsertLog(ctx, tx, b.stream, late); err != nil {
		t.Fatal(err)
	}
	early := b.create(t, 25)
	if n := b.count(t, `id IN (SELECT id FROM outbox_log)`); n != 25 {
		t.Fatalf("%d of the created tasks' rows are in the outbox log, want 25", n)
	}

	r := b.relay(t, outbox.RelayConfig{ID: "log", BatchSize: 10})
	if got := drainAll(t, r).Published; got != len(early) {
		t.Fatalf("passes before the late commit published %d rows, want the %d committed", got, len(early))
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var lateID, firstID int64
	if err := b.db.QueryRow(ctx, `SELECT (SELECT id FROM outbox_log WHERE task_id = $1), (SELECT min(id) FROM outbox_log WHERE task_id <> $1)`,
		late).Scan(&lateID, &firstID); err != nil {
		t.Fatal(err)
	}
	if lateID > firstID {
		t.Fatalf("the late transaction's row (id %d) was not written before the others (%d): the test shows nothing", lateID, firstID)
	}
	if got := drainAll(t, r).Published; got != 1 {
		t.Fatalf("passes after the late commit published %d rows, want its 1", got)
	}
	b.checkPublishedOnce(t, 26)
	if rows, sent := b.logCounts(t); rows != 26 || sent != 26 {
		t.Fatalf("outbox_event shows %d of the %d log rows SENT with their task's entry id, want all", sent, rows)
	}
	var relays int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE claimed_by = 'log' AND sent_at IS NOT NULL`).Scan(&relays); err != nil || relays != 26 {
		t.Fatalf("%d rows name the relay that published them (%v), want 26", relays, err)
	}
}

// TestLogOnePassAtATime: while a pass holds the log's position, another
// relay's pass takes none of its rows; once the first commits, the next
// pass takes the rest, and no row is published twice.
func TestLogOnePassAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.create(t, 30)
	first := b.relay(t, outbox.RelayConfig{ID: "first", BatchSize: 10})
	other := b.relay(t, outbox.RelayConfig{ID: "other", BatchSize: 10})
	var once sync.Once
	var during outbox.DrainResult
	var duringErr error
	outbox.SetAfterPublish(first, func() {
		once.Do(func() { during, duringErr = other.DrainOnce(ctx) })
	})
	res, err := first.DrainOnce(ctx)
	if err != nil || res.Published != 10 {
		t.Fatalf("first pass: %+v, %v; want 10 published", res, err)
	}
	if duringErr != nil || during.Claimed != 0 {
		t.Fatalf("a pass while another held the log's position: %+v, %v; want nothing claimed", during, duringErr)
	}
	if got := drainAll(t, other).Published; got != 20 {
		t.Fatalf("the other relay published %d rows after, want the 20 left", got)
	}
	b.checkPublishedOnce(t, 30)
}

// TestLogFailedPublishMovesTheRow: a log row whose publish failed moves
// into outbox_row with its id, RETRYING after one attempt, and is
// published from there once the stream is reachable.
func TestLogFailedPublishMovesTheRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, rdb := newDedicatedRedis(t)
	b := setupWith(t, rdb)
	ids := b.create(t, 5)
	r := b.relay(t, outbox.RelayConfig{ID: "r", PublishTimeout: time.Second, Lease: 5 * time.Second, MaxAttempts: 5})
	s.Kill()
	if res, err := r.DrainOnce(ctx); err != nil || res.Retried != 5 {
		t.Fatalf("DrainOnce with the stream down = %+v, %v; want 5 retried", res, err)
	}
	var inLog, moved int
	if err := b.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_log),
		(SELECT count(*) FROM outbox_row WHERE task_id = ANY($1) AND status = 'RETRYING' AND attempt_count = 1 AND last_error <> '')`,
		ids).Scan(&inLog, &moved); err != nil {
		t.Fatal(err)
	}
	if inLog != 0 || moved != 5 {
		t.Fatalf("after the failed publish: %d rows in the log, %d RETRYING in outbox_row; want 0 and 5", inLog, moved)
	}
	if n := b.count(t, `true`); n != 5 {
		t.Fatalf("outbox_event shows %d rows, want each task's one", n)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	b.exec(t, `UPDATE outbox_row SET next_retry_at = now()`)
	if got := drainAll(t, r).Published; got != 5 {
		t.Fatalf("published %d rows once the stream was back, want 5", got)
	}
	b.checkPublishedOnce(t, 5)
}

// TestLogPublishesAfterItsRoundsAreEmptied: with the log's tables emptied
// (a TRUNCATE, as a benchmark empties them between runs), the rows written
// since are counted unsent and published, every one, over several batches
// of the first round; with only the rounds emptied, the rows they had
// published are published again (at least once) and none is skipped by
// a batch left behind.
func TestLogPublishesAfterItsRoundsAreEmptied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `TRUNCATE outbox_log, outbox_log_batch, outbox_log_round`)
	b.create(t, 25)
	var unsent int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM outbox_log_unsent`).Scan(&unsent); err != nil || unsent != 25 {
		t.Fatalf("outbox_log_unsent counts %d rows (%v) with no round, want the 25 written", unsent, err)
	}
	r := b.relay(t, outbox.RelayConfig{ID: "r", BatchSize: 10})
	if got := drainAll(t, r).Published; got != 25 {
		t.Fatalf("published %d rows after the log's tables were emptied, want 25", got)
	}
	b.checkPublishedOnce(t, 25)

	b.exec(t, `TRUNCATE outbox_log_round`)
	b.create(t, 10)
	if got := drainAll(t, r).Published; got != 35 {
		t.Fatalf("published %d rows after the rounds were emptied, want the 10 new and the 25 published before", got)
	}
	if rows, sent := b.logCounts(t); rows != 35 || sent != 35 {
		t.Fatalf("outbox_event shows %d of the %d log rows SENT with their task's entry id, want all", sent, rows)
	}
}

// TestLogPruneRetires: outbox.PruneLog retires the published rows of the
// log: those of tasks that exist move into outbox_row, SENT with the entry
// id outbox_event showed; those of deleted tasks go; the batches and
// rounds go with the rows they held. Rows not yet published stay.
func TestLogPruneRetires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	ids := b.create(t, 12)
	r := b.relay(t, outbox.RelayConfig{ID: "r", BatchSize: 5})
	drainAll(t, r)
	before := map[uuid.UUID]string{}
	q, err := b.db.Query(ctx, `SELECT task_id, stream_id FROM outbox_event WHERE status = 'SENT'`)
	if err != nil {
		t.Fatal(err)
	}
	var id uuid.UUID
	var entry string
	if _, err := pgx.ForEachRow(q, []any{&id, &entry}, func() error { before[id] = entry; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(before) != 12 {
		t.Fatalf("%d rows SENT before the prune, want 12", len(before))
	}
	b.exec(t, `DELETE FROM ingest_task WHERE id = ANY($1)`, ids[:2])
	// A row published in the current round is not retired until a round
	// after it has begun: a new row and a pass start one.
	pending := b.create(t, 1)
	if n, err := outbox.PruneLog(ctx, b.db, time.Hour); err != nil || n != 0 {
		t.Fatalf("PruneLog keeping an hour = %d, %v; want nothing retired", n, err)
	}
	drainAll(t, r)
	b.create(t, 1) // unpublished, and so kept
	n, err := outbox.PruneLog(ctx, b.db, 0)
	if err != nil || n != 12 {
		t.Fatalf("PruneLog = %d, %v; want the 12 rows of the earlier round", n, err)
	}
	var moved int
	q, err = b.db.Query(ctx, `SELECT task_id, stream_id FROM outbox_row WHERE status = 'SENT'`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.ForEachRow(q, []any{&id, &entry}, func() error {
		if before[id] != entry {
			t.Errorf("task %s moved with entry %q, outbox_event showed %q", id, entry, before[id])
		}
		moved++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if moved != 10 {
		t.Errorf("%d rows moved into outbox_row, want the 10 of tasks that exist", moved)
	}
	var logRows, batches, rounds int
	if err := b.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_log), (SELECT count(*) FROM outbox_log_batch),
		(SELECT count(*) FROM outbox_log_round)`).Scan(&logRows, &batches, &rounds); err != nil {
		t.Fatal(err)
	}
	if logRows != 2 || batches != 1 || rounds != 2 {
		t.Errorf("after the prune: %d log rows, %d batches, %d rounds; want the 2 rows of the last round, its batch, and it and the round before", logRows, batches, rounds)
	}
	if n := b.count(t, `task_id = $1 AND status = 'SENT'`, pending[0]); n != 1 {
		t.Errorf("the row published in the last round shows %d times SENT, want once", n)
	}
	if n := b.count(t, `status = 'NEW'`); n != 1 {
		t.Errorf("%d rows NEW after the prune, want the one not yet published", n)
	}
}

// TestLogUnsentReadsPastAHeldTransaction: the log's unsent rows (the
// backlog gauges' reading, and the take's check for a new round, alike)
// are found by the txid index from the position's snapshots' xmax and by
// the transactions they saw in progress, not from their xmin: with a
// transaction held open since before thousands of rows were published,
// the reading does not walk those rows' index entries, where a range from
// the xmin does.
func TestLogUnsentReadsPastAHeldTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	holdTransaction(t, b)
	r := b.relay(t, outbox.RelayConfig{ID: "held", BatchSize: 1000})
	for range 10 {
		b.create(t, 1000)
		drainAll(t, r)
	}
	b.create(t, 20)
	var unsent int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM outbox_log_unsent`).Scan(&unsent); err != nil || unsent != 20 {
		t.Fatalf("outbox_log_unsent holds %d rows (%v), want the 20 not published", unsent, err)
	}
	settings, _ := outbox.ClaimStatements()
	viewReads := scanBuffers(t, b.db, "_txid_idx", settings, `SELECT count(*) FROM outbox_log_unsent`, nil)
	fromXmin := scanBuffers(t, b.db, "_txid_idx", settings, `SELECT count(*) FROM outbox_log_position p JOIN outbox_log l ON l.txid >= pg_snapshot_xmin(p.prev)
		WHERE NOT pg_visible_in_snapshot(l.txid, p.cur) OR (NOT pg_visible_in_snapshot(l.txid, p.prev) AND (l.txid, l.id) > (p.txid, p.id))`, nil)
	t.Logf("the unsent rows with a transaction held over 10,000 published: %d index buffers; from the snapshots' xmin %d", viewReads, fromXmin)
	if fromXmin < 10 {
		t.Fatalf("a range from the xmin read %d index buffers: the held transaction kept nothing in range; the test shows nothing", fromXmin)
	}
	if viewReads*3 > fromXmin {
		t.Errorf("outbox_log_unsent read %d index buffers, from the xmin %d: it walks the rows published since the held transaction began", viewReads, fromXmin)
	}
}
