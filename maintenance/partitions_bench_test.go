package maintenance_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/ingest-worker/ingest/bench"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/migrations"
	"github.com/ingest-worker/ingest/task"
)

// rowsExpiredSQL is retention's statement before the audit table was
// partitioned (schema version 22): the expired tasks deleted with their
// audit and outbox rows.
const rowsExpiredSQL = `
WITH pick AS (
    SELECT id FROM ingest_task
    WHERE id < (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - $5::bigint), 12, '0') || '00000000000000000000')::uuid
      AND finished_at IS NOT NULL
      AND CASE status WHEN 'SUCCEEDED' THEN $1::bigint >= 0 AND finished_at < now() - $1::bigint * interval '1 millisecond'
                      WHEN 'CANCELLED' THEN $2::bigint >= 0 AND finished_at < now() - $2::bigint * interval '1 millisecond'
                      WHEN 'DEAD' THEN $3::bigint >= 0 AND finished_at < now() - $3::bigint * interval '1 millisecond'
                      ELSE false END
    ORDER BY id
    LIMIT $4
    FOR UPDATE SKIP LOCKED),
t AS (DELETE FROM ingest_task WHERE id IN (SELECT id FROM pick) AND status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
      RETURNING id, status),
a AS (DELETE FROM ingest_task_transition WHERE task_id IN (SELECT id FROM t)),
o AS (DELETE FROM outbox_event WHERE task_id IN (SELECT id FROM t)
      RETURNING id, task_id, stream, stream_id)
SELECT count(*) FROM t`

// BenchmarkAuditRetention measures what retention costs for the audit
// rows of INGEST_AUDIT_RETENTION_TASKS expired SUCCEEDED tasks (default
// 100000), each with three audit rows (created, started, succeeded) and
// an outbox row: WAL bytes and wall time of deleting the tasks with their
// rows in batches of 1000, then of the VACUUM that reclaims the space.
// "rows" is retention before the audit table was partitioned: a database
// at schema version 22 (a plain audit table) and that version's statement
// (rowsExpiredSQL), which deletes the audit rows with their tasks;
// "partition" is retention now: the rows in a partition of a day ago, the
// tasks and outbox rows deleted (task.DeleteExpired), then the leader's
// partitions pass drops the partition. Each run starts after a
// CHECKPOINT (so both pay the same full-page images). The server is the
// test's own but WAL is server-wide (autovacuum included).
//
//	go test -run '^$' -bench BenchmarkAuditRetention -benchtime 1x -count 3 ./maintenance/
func BenchmarkAuditRetention(b *testing.B) {
	n := 100000
	if v, _ := strconv.Atoi(os.Getenv("INGEST_AUDIT_RETENTION_TASKS")); v > 0 {
		n = v
	}
	windows := task.Windows{Succeeded: time.Hour, Cancelled: time.Hour, Dead: time.Hour}
	for _, mode := range []string{"rows", "partition"} {
		b.Run(mode, func(b *testing.B) {
			var walBytes, walVacuum, secs, secsVacuum, secsDrop float64
			for range b.N {
				b.StopTimer()
				ctx := context.Background()
				var db *pgxpool.Pool
				var past []string
				if mode == "rows" {
					d := testenv.NewEmptyDatabase(b)
					db = d.Pool
					sqlDB := stdlib.OpenDBFromPool(db)
					p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.Files(),
						goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
					if err == nil {
						_, err = p.UpTo(ctx, 22)
					}
					sqlDB.Close()
					if err != nil {
						b.Fatal(err)
					}
					past = []string{"ingest_task_transition"}
				} else {
					db = testenv.DB(b)
					past = pastLayout(b, db, -24*time.Hour)
					// Outbox partitions for the rows below, so that
					// the pass measured moves none out of the DEFAULT
					// partition.
					if _, err := db.Exec(ctx, `SELECT outbox_event_extend('1 day', '2 days', $1)`, n+10000); err != nil {
						b.Fatal(err)
					}
				}
				for i, q := range []string{
					`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, status, attempt_count, finished_at)
					 SELECT (lpad(to_hex((extract(epoch FROM now() - interval '2 days') * 1000)::bigint + g), 12, '0') || substr(md5(g::text), 1, 20))::uuid,
					        'old', '{"n":1}', md5(g::text), 3, 'SUCCEEDED', 1, now() - interval '36 hours'
					 FROM generate_series(1, $1) g`,
					`INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, worker, created_at)
					 SELECT id, s.f, s.t, s.a, CASE WHEN s.a > 0 THEN 'worker-1' END, now() - interval '24 hours 30 minutes'
					 FROM ingest_task, (VALUES (NULL, 'QUEUED', 0), ('QUEUED', 'RUNNING', 1), ('RUNNING', 'SUCCEEDED', 1)) s(f, t, a)
					 WHERE kind = 'old' ORDER BY id, s.a, s.t`,
					`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at) SELECT id, 's', 'SENT', '1-1', now() - interval '2 days' FROM ingest_task WHERE kind = 'old'`,
					`VACUUM ANALYZE ingest_task`, `VACUUM ANALYZE ingest_task_transition`, `VACUUM ANALYZE outbox_row`, `CHECKPOINT`,
				} {
					var args []any
					if i == 0 {
						args = []any{n}
					}
					if _, err := db.Exec(ctx, q, args...); err != nil {
						b.Fatal(err)
					}
				}
				var rows int
				if err := db.QueryRow(ctx, `SELECT count(*) FROM `+past[0]).Scan(&rows); err != nil || rows != 3*n {
					b.Fatalf("%d audit rows in %s, %v; want %d", rows, past[0], err, 3*n)
				}
				w0, err := bench.SettledWAL(ctx, db)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				begun := time.Now()
				deleted := 0
				for {
					var got []task.Deleted
					if mode == "rows" {
						batch := &pgx.Batch{}
						batch.Queue(task.RescuePlanSQL)
						ms := time.Hour.Milliseconds()
						batch.Queue(rowsExpiredSQL, ms, ms, ms, 1000, ms)
						br := db.SendBatch(ctx, batch)
						var k int
						if _, err = br.Exec(); err == nil {
							err = br.QueryRow().Scan(&k)
						}
						if cerr := br.Close(); err == nil {
							err = cerr
						}
						got = make([]task.Deleted, k)
					} else {
						got, err = task.DeleteExpired(ctx, db, windows, 1000)
					}
					if err != nil {
						b.Fatal(err)
					}
					deleted += len(got)
					if len(got) < 1000 {
						break
					}
				}
				if mode == "partition" {
					p, err := maintenance.NewPartitions(maintenance.PartitionsConfig{}, db, nil)
					if err != nil {
						b.Fatal(err)
					}
					passBegun := time.Now()
					res, err := p.RunOnce(ctx)
					secsDrop += time.Since(passBegun).Seconds()
					if err != nil || len(res.Dropped) != 1 {
						b.Fatalf("partitions pass = %+v, %v; want %s dropped", res, err, past[0])
					}
				}
				took := time.Since(begun)
				b.StopTimer()
				w1, err := bench.SettledWAL(ctx, db)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				begun = time.Now()
				if _, err := db.Exec(ctx, `VACUUM ingest_task, ingest_task_transition, outbox_row`); err != nil {
					b.Fatal(err)
				}
				tookVacuum := time.Since(begun)
				b.StopTimer()
				w2, err := bench.SettledWAL(ctx, db)
				if err != nil {
					b.Fatal(err)
				}
				if deleted != n {
					b.Fatalf("deleted %d tasks, want %d", deleted, n)
				}
				if err := db.QueryRow(ctx, `SELECT count(*) FROM ingest_task_transition`).Scan(&rows); err != nil || rows != 0 {
					b.Fatalf("%d audit rows left, %v", rows, err)
				}
				walBytes += float64(w1.LSN - w0.LSN)
				walVacuum += float64(w2.LSN - w1.LSN)
				secs += took.Seconds()
				secsVacuum += tookVacuum.Seconds()
			}
			b.ReportMetric(walBytes/float64(b.N), "WAL-bytes-delete/op")
			b.ReportMetric(walVacuum/float64(b.N), "WAL-bytes-vacuum/op")
			b.ReportMetric(secs/float64(b.N), "s-delete/op")
			b.ReportMetric(secsVacuum/float64(b.N), "s-vacuum/op")
			if mode == "partition" {
				b.ReportMetric(secsDrop/float64(b.N), "s-partitions-pass/op")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkOutboxRetention measures what retention costs for the outbox
// rows of INGEST_OUTBOX_RETENTION_TASKS expired SUCCEEDED tasks (default
// 100000), each with one SENT outbox row (no audit rows: those are
// BenchmarkAuditRetention's): WAL bytes and wall time of deleting the
// tasks in batches of 1000 and what goes with them, then of the VACUUM
// that reclaims the space. "rows" is retention before the outbox was
// partitioned: a database at schema version 24 (a plain outbox table)
// and that version's statement (rowsOutboxExpiredSQL), which deletes the
// outbox rows with their tasks; "partition" is retention now: the rows in
// a partition whose ids have all been taken, the tasks deleted with their
// outbox rows read (task.DeleteExpired), then the leader's partitions
// passes (the first sees the partition full, the second drops it). Each
// run starts after a CHECKPOINT.
//
//	go test -run '^$' -bench BenchmarkOutboxRetention -benchtime 1x -count 3 ./maintenance/
func BenchmarkOutboxRetention(b *testing.B) {
	n := 100000
	if v, _ := strconv.Atoi(os.Getenv("INGEST_OUTBOX_RETENTION_TASKS")); v > 0 {
		n = v
	}
	windows := task.Windows{Succeeded: time.Hour, Cancelled: time.Hour, Dead: time.Hour}
	for _, mode := range []string{"rows", "partition"} {
		b.Run(mode, func(b *testing.B) {
			var walBytes, walVacuum, secs, secsVacuum, secsDrop float64
			for range b.N {
				b.StopTimer()
				ctx := context.Background()
				var db *pgxpool.Pool
				if mode == "rows" {
					d := testenv.NewEmptyDatabase(b)
					db = d.Pool
					sqlDB := stdlib.OpenDBFromPool(db)
					p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.Files(),
						goose.WithTableName(migrations.VersionTable), goose.WithDisableGlobalRegistry(true))
					if err == nil {
						_, err = p.UpTo(ctx, 24)
					}
					sqlDB.Close()
					if err != nil {
						b.Fatal(err)
					}
				} else {
					db = testenv.DB(b)
					parts, _ := listOutboxPartitions(b, db)
					for _, p := range parts {
						if !p.Default && !p.Unbounded {
							if _, err := db.Exec(ctx, `ALTER TABLE outbox_row DETACH PARTITION `+p.Name); err != nil {
								b.Fatal(err)
							}
							if _, err := db.Exec(ctx, `DROP TABLE `+p.Name); err != nil {
								b.Fatal(err)
							}
						}
					}
					for _, q := range []string{
						`CREATE TABLE outbox_event_past PARTITION OF outbox_row FOR VALUES FROM (1) TO (` + strconv.Itoa(n+1) + `)`,
						`CREATE TABLE outbox_event_now PARTITION OF outbox_row FOR VALUES FROM (` + strconv.Itoa(n+1) + `) TO (` + strconv.Itoa(n+100001) + `)`,
					} {
						if _, err := db.Exec(ctx, q); err != nil {
							b.Fatal(err)
						}
					}
				}
				for i, q := range []string{
					`INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts, status, attempt_count, finished_at)
					 SELECT (lpad(to_hex((extract(epoch FROM now() - interval '2 days') * 1000)::bigint + g), 12, '0') || substr(md5(g::text), 1, 20))::uuid,
					        'old', '{"n":1}', md5(g::text), 3, 'SUCCEEDED', 1, now() - interval '36 hours'
					 FROM generate_series(1, $1) g`,
					`INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at, created_at)
					 SELECT id, 's', 'SENT', '1-1', now() - interval '2 days', now() - interval '2 days' FROM ingest_task WHERE kind = 'old' ORDER BY id`,
					`VACUUM ANALYZE ingest_task`, `VACUUM ANALYZE outbox_row`, `CHECKPOINT`,
				} {
					var args []any
					if i == 0 {
						args = []any{n}
					}
					if _, err := db.Exec(ctx, q, args...); err != nil {
						b.Fatal(err)
					}
				}
				w0, err := bench.SettledWAL(ctx, db)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				begun := time.Now()
				deleted := 0
				for {
					var got []task.Deleted
					if mode == "rows" {
						batch := &pgx.Batch{}
						batch.Queue(task.RescuePlanSQL)
						ms := time.Hour.Milliseconds()
						batch.Queue(rowsOutboxExpiredSQL, ms, ms, ms, 1000, ms)
						br := db.SendBatch(ctx, batch)
						var k int
						if _, err = br.Exec(); err == nil {
							err = br.QueryRow().Scan(&k)
						}
						if cerr := br.Close(); err == nil {
							err = cerr
						}
						got = make([]task.Deleted, k)
					} else {
						got, err = task.DeleteExpired(ctx, db, windows, 1000)
					}
					if err != nil {
						b.Fatal(err)
					}
					deleted += len(got)
					if len(got) < 1000 {
						break
					}
				}
				if mode == "partition" {
					p, err := maintenance.NewPartitions(maintenance.PartitionsConfig{}, db, nil)
					if err != nil {
						b.Fatal(err)
					}
					passBegun := time.Now()
					var dropped []string
					for range 2 {
						res, err := p.RunOnce(ctx)
						if err != nil {
							b.Fatal(err)
						}
						dropped = append(dropped, res.OutboxDropped...)
					}
					secsDrop += time.Since(passBegun).Seconds()
					if !slices.Contains(dropped, "outbox_event_past") {
						b.Fatalf("partitions passes dropped %v; want outbox_event_past", dropped)
					}
				}
				took := time.Since(begun)
				b.StopTimer()
				w1, err := bench.SettledWAL(ctx, db)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				begun = time.Now()
				if _, err := db.Exec(ctx, `VACUUM ingest_task, outbox_row`); err != nil {
					b.Fatal(err)
				}
				tookVacuum := time.Since(begun)
				b.StopTimer()
				w2, err := bench.SettledWAL(ctx, db)
				if err != nil {
					b.Fatal(err)
				}
				var rows int
				if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox_event`).Scan(&rows); err != nil || deleted != n || rows != 0 {
					b.Fatalf("deleted %d tasks (want %d), %d outbox rows left, %v", deleted, n, rows, err)
				}
				walBytes += float64(w1.LSN - w0.LSN)
				walVacuum += float64(w2.LSN - w1.LSN)
				secs += took.Seconds()
				secsVacuum += tookVacuum.Seconds()
			}
			b.ReportMetric(walBytes/float64(b.N), "WAL-bytes-delete/op")
			b.ReportMetric(walVacuum/float64(b.N), "WAL-bytes-vacuum/op")
			b.ReportMetric(secs/float64(b.N), "s-delete/op")
			b.ReportMetric(secsVacuum/float64(b.N), "s-vacuum/op")
			if mode == "partition" {
				b.ReportMetric(secsDrop/float64(b.N), "s-partitions-passes/op")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// rowsOutboxExpiredSQL is retention's statement before the outbox was
// partitioned (schema version 24): the expired tasks deleted with their
// outbox rows.
const rowsOutboxExpiredSQL = `
WITH pick AS (
    SELECT id FROM ingest_task
    WHERE id < (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint - $5::bigint), 12, '0') || '00000000000000000000')::uuid
      AND finished_at IS NOT NULL
      AND CASE status WHEN 'SUCCEEDED' THEN $1::bigint >= 0 AND finished_at < now() - $1::bigint * interval '1 millisecond'
                      WHEN 'CANCELLED' THEN $2::bigint >= 0 AND finished_at < now() - $2::bigint * interval '1 millisecond'
                      WHEN 'DEAD' THEN $3::bigint >= 0 AND finished_at < now() - $3::bigint * interval '1 millisecond'
                      ELSE false END
    ORDER BY id
    LIMIT $4
    FOR UPDATE SKIP LOCKED),
t AS (DELETE FROM ingest_task WHERE id IN (SELECT id FROM pick) AND status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')
      RETURNING id, status),
o AS (DELETE FROM outbox_event WHERE task_id IN (SELECT id FROM t)
      RETURNING id, task_id, stream, stream_id)
SELECT count(*) FROM t`
