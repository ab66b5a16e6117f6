package maintenance_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/partition"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

func listOutboxPartitions(t testing.TB, db *pgxpool.Pool) ([]outbox.Partition, int64) {
	t.Helper()
	parts, last, _, err := outbox.Partitions(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return parts, last
}

// outboxPartitionOf returns the partition that holds the outbox row id.
func outboxPartitionOf(t *testing.T, db *pgxpool.Pool, id int64) string {
	t.Helper()
	var name string
	if err := db.QueryRow(context.Background(), `SELECT tableoid::regclass::text FROM outbox_row WHERE id = $1`, id).Scan(&name); err != nil {
		t.Fatal(err)
	}
	return name
}

// outboxRows is a task's outbox rows, as the operator's query reads them.
func outboxRows(t *testing.T, db *pgxpool.Pool, id uuid.UUID) []string {
	t.Helper()
	return rowStrings(t, db, `SELECT id, status, attempt_count, next_retry_at, last_error, created_at, sent_at, stream_id
		FROM outbox_event WHERE task_id = $1 ORDER BY id`, id)
}

// checkOpened fails unless the partitions a pass created begin at from
// and follow one another without a gap, each holding width ids.
func checkOpened(t *testing.T, created []outbox.Partition, from, width int64) {
	t.Helper()
	next := from
	for _, c := range created {
		if c.Default || c.From != next {
			t.Errorf("partition %s holds [%d, %d); want it to begin at %d: %+v", c.Name, c.From, c.To, next, created)
		}
		if n := c.To - c.From; math.Abs(float64(n-width)) > float64(width)/100 {
			t.Errorf("partition %s holds %d ids, want about %d", c.Name, n, width)
		}
		next = c.To
	}
}

// TestOutboxPartitionsCreatedAhead: a row whose id lies beyond every
// partition lands in the DEFAULT partition and stays there: a pass opens
// partitions, OutboxMinIDs each while ids come slowly, from just past the
// last id taken (not from the newest one's end, which the ids being
// written have passed), until they reach OutboxMinIDs further; with ids taken
// at a known rate over the last Width, each new partition holds the ids a
// Width takes and they reach the ids Ahead takes; a pass with nothing to
// do creates nothing.
func TestOutboxPartitionsCreatedAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const minIDs = 100
	p := b.partitions(t, maintenance.PartitionsConfig{OutboxMinIDs: minIDs})

	before, _ := listOutboxPartitions(t, b.db)
	newest := before[len(before)-2]
	if newest.Default || !before[len(before)-1].Default {
		t.Fatalf("outbox partitions after the migration: %+v; want the DEFAULT one last", before)
	}
	b.exec(t, `SELECT setval(pg_get_serial_sequence('outbox_row', 'id'), $1)`, newest.To+50)
	id := b.createRows(t, 1)[0]
	var rowID int64
	if err := b.db.QueryRow(ctx, `SELECT id FROM outbox_event WHERE task_id = $1`, id).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	if got := outboxPartitionOf(t, b.db, rowID); got != "outbox_event_default" {
		t.Fatalf("row %d beyond the partitions (to %d) is in %s, want the DEFAULT partition", rowID, newest.To, got)
	}
	// No row of the last Width: no rate, ids are taken slowly.
	b.exec(t, `UPDATE outbox_event SET created_at = created_at - interval '3 days'`)
	rows := outboxRows(t, b.db, id)

	res, err := p.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after, last := listOutboxPartitions(t, b.db)
	created := after[len(before)-1 : len(after)-1]
	if res.OutboxCreated != len(created) || len(created) == 0 {
		t.Fatalf("pass created %d, partitions %+v; want those past row %d counted", res.OutboxCreated, after, rowID)
	}
	checkOpened(t, created, last+1, minIDs)
	if reach := created[len(created)-1].To; reach <= last+minIDs {
		t.Errorf("partitions reach %d, want past the last id %d + %d", reach, last, minIDs)
	}
	if got := outboxPartitionOf(t, b.db, rowID); got != "outbox_event_default" {
		t.Errorf("row %d moved to %s; want it kept in the DEFAULT partition", rowID, got)
	}
	if got := outboxRows(t, b.db, id); !slices.Equal(got, rows) {
		t.Errorf("the task's outbox rows after the pass: %v, want %v", got, rows)
	}
	if res, err := p.RunOnce(ctx); err != nil || res.OutboxCreated != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing created", res, err)
	}

	// 1,000 ids an hour over the last 12 hours: a day's partition holds
	// 24,000 ids, and they reach 48,000 past the last id.
	base := last + 10
	b.exec(t, `SELECT setval(pg_get_serial_sequence('outbox_row', 'id'), $1)`, base)
	b.exec(t, `INSERT INTO outbox_event (id, task_id, stream, status, stream_id, sent_at, created_at)
		VALUES ($1, $2, 's', 'SENT', '1-1', now(), now() - interval '12 hours')`, base+1, id)
	b.exec(t, `SELECT setval(pg_get_serial_sequence('outbox_row', 'id'), $1)`, base+1+12000)
	res, err = p.RunOnce(ctx)
	if err != nil || res.OutboxCreated == 0 {
		t.Fatalf("pass after 12,000 ids = %+v, %v; want partitions created", res, err)
	}
	grown, last := listOutboxPartitions(t, b.db)
	// The newest partition ended below the ids being taken: the first new
	// one begins just past the last id.
	checkOpened(t, grown[len(after)-1:len(grown)-1], last+1, 24000)
	if reach := grown[len(grown)-2].To; reach < last+48000-480 {
		t.Errorf("partitions reach %d, want about 48,000 past the last id %d", reach, last)
	}
}

// TestOutboxPartitionsDroppedWithTasksInFlight: the first partition holds
// the rows of a task retention deletes, of a task in flight (published,
// running) and of a task not yet published. It is not dropped while its
// ids are not all seen taken, nor while a transaction from before that is
// open, nor while a row in it is still to publish; once published, it is
// dropped: the deleted task's row goes with it, the two tasks that exist
// keep theirs (same ids and values, in the DEFAULT partition), the
// relay publishes on, and the sweep of the DEFAULT partition deletes the
// kept rows of a task deleted since.
func TestOutboxPartitionsDroppedWithTasksInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// The migration's partitions: the history (nothing before it) and
	// one from id 1; the first becomes [1, 6).
	parts, _ := listOutboxPartitions(t, b.db)
	for _, p := range parts {
		if p.From == 1 && !p.Default {
			b.exec(t, `ALTER TABLE outbox_row DETACH PARTITION `+p.Name)
			b.exec(t, `DROP TABLE `+p.Name)
			b.exec(t, `CREATE TABLE outbox_first PARTITION OF outbox_row FOR VALUES FROM (1) TO (6)`)
			b.exec(t, fmt.Sprintf(`CREATE TABLE outbox_second PARTITION OF outbox_row FOR VALUES FROM (6) TO (%d)`, p.To))
		}
	}
	p := b.partitions(t, maintenance.PartitionsConfig{})
	pass := func() maintenance.PartitionsResult {
		t.Helper()
		res, err := p.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	x := b.agedTask(t, task.Succeeded, 3*time.Hour) // row 1: deleted by retention
	s := b.agedTask(t, task.Running, 3*time.Hour)   // row 2: in flight
	b.publishAll(t)
	u := b.createRows(t, 1)[0] // row 3: not yet published
	b.exec(t, `SELECT setval(pg_get_serial_sequence('outbox_row', 'id'), 5)`)
	for i, id := range []uuid.UUID{x, s, u} {
		var rowID int64
		if err := b.db.QueryRow(ctx, `SELECT id FROM outbox_event WHERE task_id = $1`, id).Scan(&rowID); err != nil || rowID != int64(i+1) {
			t.Fatalf("task %d's outbox row %d, %v; want %d", i, rowID, err, i+1)
		}
	}
	if d, err := task.DeleteExpired(ctx, b.db, task.Windows{Succeeded: time.Hour, Cancelled: time.Hour, Dead: time.Hour}, 10); err != nil || len(d) != 1 || d[0].ID != x {
		t.Fatalf("DeleteExpired = %+v, %v; want the finished task", d, err)
	}
	sRows := outboxRows(t, b.db, s)

	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if res := pass(); slices.Contains(res.OutboxDropped, "outbox_first") {
		t.Fatalf("first pass = %+v; want the partition only seen full", res)
	}
	if res := pass(); slices.Contains(res.OutboxDropped, "outbox_first") {
		t.Fatalf("pass with a transaction from before open = %+v; want nothing dropped", res)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if res := pass(); slices.Contains(res.OutboxDropped, "outbox_first") || res.OutboxHeld != 1 {
		t.Fatalf("pass with a row to publish = %+v; want the partition held", res)
	}
	b.publishAll(t)
	uRows := outboxRows(t, b.db, u)
	res := pass()
	if !slices.Contains(res.OutboxDropped, "outbox_first") || res.Kept != 2 {
		t.Fatalf("pass after the publish = %+v; want outbox_first dropped, 2 rows kept", res)
	}
	if slices.Contains(partitionNamesOf(t, b.db), "outbox_first") {
		t.Fatal("outbox_first is still there")
	}
	if got := outboxRows(t, b.db, s); !slices.Equal(got, sRows) {
		t.Errorf("the running task's outbox rows: %v, want %v", got, sRows)
	}
	if got := outboxRows(t, b.db, u); !slices.Equal(got, uRows) {
		t.Errorf("the published task's outbox rows: %v, want %v", got, uRows)
	}
	for _, id := range []int64{2, 3} {
		if got := outboxPartitionOf(t, b.db, id); got != "outbox_event_default" {
			t.Errorf("row %d is in %s, want the DEFAULT partition", id, got)
		}
	}
	if n := b.count(t, `id = 1`); n != 0 {
		t.Errorf("the deleted task's row is still there")
	}
	if !slices.Contains(partitionNamesOf(t, b.db), "outbox_second") {
		t.Error("the current partition was dropped")
	}

	// The relay publishes a new row of the running task.
	if err := outbox.Insert(ctx, b.db, b.stream, s); err != nil {
		t.Fatal(err)
	}
	b.publishAll(t)
	if n := b.count(t, `task_id = $1 AND status = 'SENT'`, s); n != 2 {
		t.Errorf("the running task has %d SENT rows, want 2", n)
	}
	// Deleted since: its kept row goes with the sweep.
	b.exec(t, `DELETE FROM ingest_task WHERE id = $1`, u)
	if n, err := partition.Sweep(ctx, b.db, "outbox_event_default"); err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want the deleted task's row", n, err)
	}
	if got := outboxRows(t, b.db, s); len(got) != 2 || got[0] != sRows[0] {
		t.Errorf("the running task's rows after the sweep: %v", got)
	}
}

func partitionNamesOf(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	parts, _ := listOutboxPartitions(t, db)
	var out []string
	for _, p := range parts {
		out = append(out, p.Name)
	}
	return out
}

// TestOutboxPartitionsOpenedWhileIdsOverrunThem: rows are inserted without
// pause, in batches, faster than partitions of OutboxMinIDs ids last,
// while the extension runs again and again, as on a new database taking
// more rows in its first minute than its first partitions hold. Every
// insert succeeds and every row is kept: a partition near the ids being
// taken is attached while no outbox row is being written. (Attached over
// the ids being written, it fails an insert that routed its rows before
// it was there: "new row for relation "outbox_event_default" violates
// partition constraint".)
func TestOutboxPartitionsOpenedWhileIdsOverrunThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	id := b.createRows(t, 1)[0]
	const minIDs, batch, writers, passes = 2000, 40, 3, 150
	// The ids being taken have reached the end of the partitions.
	parts, _ := listOutboxPartitions(t, b.db)
	b.exec(t, `SELECT setval(pg_get_serial_sequence('outbox_row', 'id'), $1)`, parts[len(parts)-2].To-1)

	var inserted atomic.Int64
	stop := make(chan struct{})
	failed := make(chan error, writers)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				tag, err := b.db.Exec(ctx, `INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at)
					SELECT $1, 's', 'SENT', '1-1', now() FROM generate_series(1, $2)`, id, batch)
				if err != nil {
					failed <- err
					return
				}
				inserted.Add(tag.RowsAffected())
			}
		})
	}
	opened, refused := 0, 0
	// Up to passes passes or 30 s: opened from the newest partition's end,
	// one pass may have to open thousands of partitions to catch up.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < passes && time.Now().Before(deadline); i++ {
		pctx, cancel := context.WithDeadline(ctx, deadline)
		n, err := outbox.Extend(pctx, b.db, time.Minute, time.Minute, minIDs, time.Second)
		cancel()
		if err != nil {
			refused++
			continue
		}
		opened += n
		if len(failed) > 0 {
			break
		}
	}
	close(stop)
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Errorf("an insert failed while partitions were opened: %v", err)
	}
	if opened == 0 {
		t.Errorf("no partition opened in %d passes (%d failed)", passes, refused)
	}
	var rows int64
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if want := inserted.Load() + 1; rows != want {
		t.Errorf("%d rows of the task, want %d", rows, want)
	}
	t.Logf("%d rows inserted; %d partitions opened, %d passes failed", inserted.Load(), opened, refused)
}
