// Command floor measures the floor of a durable PostgreSQL queue on the
// database it is given: the least work any such queue must do per job,
// done with the batches `ingest-worker bench` uses, so that
// bench/compare.sh can print ingest-worker's and River's throughput as
// multiples of it.
//
// It owns one table of its own, bench_floor_job (created if missing,
// emptied before and after each run): a job is a row with an identity key,
// a state, the bench's payload and three timestamps, and a partial index
// on the available rows, which is how a queue finds work. Per job it does
// three writes and nothing else (no audit row, no outbox, no broker):
//
//   - insert: --producers goroutines insert --insert-batch rows per
//     statement (the bench's producers and insert batch);
//   - start: --parallel loops each take up to --start-batch available rows
//     (the bench's read count) with FOR UPDATE SKIP LOCKED and mark them
//     started, in one statement;
//   - done: the started ids are gathered for up to --complete-window or
//     --complete-batch of them (the bench's completer batch) and marked done
//     by --parallel flushers, one statement a batch.
//
// --mode preload inserts every job first and times from the start of the
// workers to the last done; --mode continuous times from the first insert
// to the last done, the workers polling every millisecond while nothing is
// available. The defaults are read from package bench and the worker's
// configuration, so the floor batches as the bench does.
//
// Without --database-url (or $INGEST_DATABASE_URL) it starts a throwaway
// PostgreSQL as `ingest-worker bench` does (fsync and synchronous_commit
// on). --json prints the report with jobs_per_sec, as bench/river does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/bench"
	"github.com/ingest-worker/ingest/internal/pgtemp"
)

// idlePoll is how long a start loop waits when no job is available
// (continuous mode, the producers behind).
const idlePoll = time.Millisecond

// The table: state 0 is available, 1 started, 2 done.
const schemaSQL = `CREATE TABLE IF NOT EXISTS bench_floor_job (
	id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	state       smallint NOT NULL DEFAULT 0,
	payload     jsonb NOT NULL,
	created_at  timestamptz NOT NULL DEFAULT now(),
	started_at  timestamptz,
	finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS bench_floor_job_available ON bench_floor_job (id) WHERE state = 0`

const (
	insertSQL = `INSERT INTO bench_floor_job (payload) SELECT $1::jsonb FROM generate_series(1, $2::int)`
	// The start locks its rows once, in a materialized CTE, and updates
	// them by primary key. Its first form, an UPDATE joined to a locking
	// subquery, was planned on the emptied table as a nested loop that
	// scanned the whole table and ran the locking subquery again for each
	// row, and once deadlocked with a done.
	startSQL = `WITH a AS MATERIALIZED (SELECT id FROM bench_floor_job WHERE state = 0 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
	UPDATE bench_floor_job j SET state = 1, started_at = now() WHERE j.id = ANY (ARRAY(SELECT id FROM a)) RETURNING j.id`
	doneSQL = `UPDATE bench_floor_job SET state = 2, finished_at = now() WHERE id = ANY($1::bigint[]) AND state = 1`
)

type options struct {
	bench.Flags
	databaseURL    string
	payloadBytes   int
	startBatch     int
	completeBatch  int
	completeWindow time.Duration
	parallel       int
}

func (o options) validate() error {
	switch {
	case o.payloadBytes < 0 || o.payloadBytes > bench.MaxPayloadBytes:
		return fmt.Errorf("--payload-bytes must be in [0, %d], got %d", bench.MaxPayloadBytes, o.payloadBytes)
	case o.startBatch < 1:
		return fmt.Errorf("--start-batch must be >= 1, got %d", o.startBatch)
	case o.completeBatch < 1:
		return fmt.Errorf("--complete-batch must be >= 1, got %d", o.completeBatch)
	case o.completeWindow < 0:
		return fmt.Errorf("--complete-window must be >= 0, got %s", o.completeWindow)
	case o.parallel < 1 || o.parallel > 64:
		return fmt.Errorf("--parallel must be in [1, 64], got %d", o.parallel)
	}
	return o.Flags.Validate()
}

type report struct {
	System         string  `json:"system"`
	Mode           string  `json:"mode"`
	Jobs           int     `json:"jobs"`
	Done           int     `json:"done"`
	JobsPerSec     float64 `json:"jobs_per_sec"`
	WorkSeconds    float64 `json:"work_seconds"`
	InsertPerSec   float64 `json:"insert_per_sec"`
	InsertSeconds  float64 `json:"insert_seconds"`
	PayloadBytes   int     `json:"payload_bytes"`
	Producers      int     `json:"producers"`
	InsertBatch    int     `json:"insert_batch"`
	StartBatch     int     `json:"start_batch"`
	CompleteBatch  int     `json:"complete_batch"`
	CompleteWindow string  `json:"complete_window"`
	Parallel       int     `json:"parallel"`
	PoolConns      int     `json:"pool_conns"`
}

func main() {
	var o options
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	o.Register(fs, "rows in bench_floor_job")
	fs.StringVar(&o.databaseURL, "database-url", os.Getenv("INGEST_DATABASE_URL"), "PostgreSQL URL (default $INGEST_DATABASE_URL; none: a throwaway server); bench_floor_job is created and emptied there")
	fs.IntVar(&o.payloadBytes, "payload-bytes", 0, "length of a string carried in each job's payload (0: none)")
	fs.IntVar(&o.startBatch, "start-batch", bench.DefaultReadCount, "most jobs one start statement takes")
	fs.IntVar(&o.completeBatch, "complete-batch", bench.DefaultCompleteBatch, "most jobs per done statement")
	fs.DurationVar(&o.completeWindow, "complete-window", bench.DefaultCompleteWindow, "longest wait gathering started jobs for a done statement")
	fs.IntVar(&o.parallel, "parallel", ingest.DefaultCompleteParallel, "start loops, and done statements that may run at once")
	bench.Parse("floor", fs, func() error { return o.validate() })
	bench.Main("floor", o.JSON, func(ctx context.Context) (report, error) { return run(ctx, o, os.Stderr) }, printReport)
}

func printReport(w io.Writer, r report) {
	fmt.Fprintf(w, "\nRESULT  floor, %s, %d jobs\n", r.Mode, r.Jobs)
	fmt.Fprintf(w, "jobs/s worked    %.0f  (%d done in %.2fs)\n", r.JobsPerSec, r.Done, r.WorkSeconds)
	fmt.Fprintf(w, "jobs/s inserted  %.0f  (%.2fs)\n", r.InsertPerSec, r.InsertSeconds)
}

func run(ctx context.Context, o options, progress io.Writer) (report, error) {
	rep := report{System: "floor", Mode: o.Mode, Jobs: o.Jobs, PayloadBytes: o.payloadBytes, Producers: o.Producers,
		InsertBatch: o.InsertBatch, StartBatch: o.startBatch, CompleteBatch: o.completeBatch,
		CompleteWindow: o.completeWindow.String(), Parallel: o.parallel, PoolConns: o.PoolConns}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	url := o.databaseURL
	if url == "" {
		srv, err := bench.StartServers(ctx, true, false)
		if errors.Is(err, pgtemp.ErrNoBinaries) {
			return rep, fmt.Errorf("no --database-url and no PostgreSQL server binaries to start one: %w", err)
		}
		if err != nil {
			return rep, err
		}
		defer srv.Close()
		url = srv.DatabaseURL
		fmt.Fprintf(progress, "PostgreSQL: %s\n", srv.Postgres)
	}
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return rep, fmt.Errorf("database-url: %w", err)
	}
	pc.MaxConns = int32(o.PoolConns)
	// The table is emptied before each run and not analyzed during it:
	// its statements keep their index paths, as ingest-worker's hot
	// statements do on a never-analyzed table, instead of the scans the
	// planner picks for a table it believes empty.
	pc.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	pc.ConnConfig.RuntimeParams["enable_bitmapscan"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return rep, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, schemaSQL); err != nil {
		return rep, fmt.Errorf("create bench_floor_job: %w", err)
	}
	if _, err := pool.Exec(ctx, `TRUNCATE bench_floor_job RESTART IDENTITY`); err != nil {
		return rep, fmt.Errorf("empty bench_floor_job: %w", err)
	}
	if !o.Keep {
		defer func() {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer ccancel()
			_, _ = pool.Exec(cctx, `TRUNCATE bench_floor_job`)
		}()
	}
	payload, err := json.Marshal(map[string]any{"bench": true})
	if o.payloadBytes > 0 {
		payload, err = json.Marshal(map[string]any{"bench": true, "pad": bench.Pad(o.payloadBytes)})
	}
	if err != nil {
		return rep, err
	}
	fmt.Fprintf(progress, "floor: PostgreSQL floor (insert, start, done; no audit, outbox or broker; start batch %d, done batch %d/%s, %d parallel, %d connections): %d jobs, %s mode\n",
		o.startBatch, o.completeBatch, o.completeWindow, o.parallel, o.PoolConns, o.Jobs, o.Mode)

	w := &worker{o: o, pool: pool, payload: payload}
	stopProgress := w.progress(progress, time.Now())
	defer stopProgress()
	var insertStart, insertEnd, workStart time.Time
	if o.Mode == "preload" {
		insertStart = time.Now()
		if err := w.insert(ctx); err != nil {
			return rep, err
		}
		insertEnd = time.Now()
		workStart = time.Now()
		if err := w.work(ctx); err != nil {
			return rep, err
		}
	} else {
		insertStart = time.Now()
		workStart = insertStart
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			err := w.insert(gctx)
			insertEnd = time.Now()
			return err
		})
		g.Go(func() error { return w.work(gctx) })
		if err := g.Wait(); err != nil {
			return rep, err
		}
	}
	workEnd := w.end
	stopProgress()
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bench_floor_job WHERE state = 2`).Scan(&rep.Done); err != nil {
		return rep, fmt.Errorf("count done jobs: %w", err)
	}
	if rep.Done != o.Jobs {
		return rep, fmt.Errorf("%d of %d jobs are done in bench_floor_job", rep.Done, o.Jobs)
	}
	rep.InsertSeconds = insertEnd.Sub(insertStart).Seconds()
	rep.WorkSeconds = workEnd.Sub(workStart).Seconds()
	rep.InsertPerSec = float64(o.Jobs) / rep.InsertSeconds
	rep.JobsPerSec = float64(o.Jobs) / rep.WorkSeconds
	return rep, nil
}

type worker struct {
	o       options
	pool    *pgxpool.Pool
	payload []byte

	inserted, started, done atomic.Int64
	doneOnce                sync.Once
	end                     time.Time // when the last job was done
}

// insert inserts o.Jobs jobs with o.Producers goroutines, o.InsertBatch per
// statement.
func (w *worker) insert(ctx context.Context) error {
	o := w.o
	return bench.Produce(ctx, o.Jobs, o.InsertBatch, o.Producers, func(ctx context.Context, n int) error {
		if _, err := w.pool.Exec(ctx, insertSQL, w.payload, n); err != nil {
			return fmt.Errorf("insert %d jobs: %w", n, err)
		}
		w.inserted.Add(int64(n))
		return nil
	})
}

// work starts and finishes jobs until o.Jobs are done: o.parallel start
// loops feed one gatherer, which hands batches to o.parallel flushers.
func (w *worker) work(ctx context.Context) error {
	o := w.o
	started := make(chan []int64, o.parallel)
	g, ctx := errgroup.WithContext(ctx)
	var starters sync.WaitGroup
	for range o.parallel {
		starters.Add(1)
		g.Go(func() error {
			defer starters.Done()
			return w.start(ctx, started)
		})
	}
	go func() {
		starters.Wait()
		close(started)
	}()
	flush := make(chan []int64)
	for range o.parallel {
		g.Go(func() error {
			for ids := range flush {
				if err := w.finish(ctx, ids); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer close(flush)
		return gather(ctx, started, flush, o.completeBatch, o.completeWindow)
	})
	return g.Wait()
}

// start runs one start loop until every job has been started.
func (w *worker) start(ctx context.Context, out chan<- []int64) error {
	for w.started.Load() < int64(w.o.Jobs) {
		rows, err := w.pool.Query(ctx, startSQL, w.o.startBatch)
		if err != nil {
			return fmt.Errorf("start jobs: %w", err)
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("start jobs: %w", err)
		}
		if len(ids) == 0 {
			t := time.NewTimer(idlePoll)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		w.started.Add(int64(len(ids)))
		select {
		case out <- ids:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// gather batches started ids for up to window or max of them, as the
// worker's completer does, and hands each batch to flush.
func gather(ctx context.Context, in <-chan []int64, flush chan<- []int64, max int, window time.Duration) error {
	var batch []int64
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	send := func() error {
		for len(batch) > 0 {
			n := min(len(batch), max)
			select {
			case flush <- batch[:n:n]:
			case <-ctx.Done():
				return ctx.Err()
			}
			batch = batch[n:]
		}
		batch = nil
		return nil
	}
	for {
		select {
		case ids, ok := <-in:
			if !ok {
				return send()
			}
			if len(batch) == 0 {
				timer.Reset(window)
			}
			batch = append(batch, ids...)
			if len(batch) >= max {
				timer.Stop()
				if err := send(); err != nil {
					return err
				}
			}
		case <-timer.C:
			if err := send(); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// finish marks ids done in one statement.
func (w *worker) finish(ctx context.Context, ids []int64) error {
	if _, err := w.pool.Exec(ctx, doneSQL, ids); err != nil {
		return fmt.Errorf("finish %d jobs: %w", len(ids), err)
	}
	if w.done.Add(int64(len(ids))) >= int64(w.o.Jobs) {
		w.doneOnce.Do(func() { w.end = time.Now() })
	}
	return nil
}

// progress prints a line every 2 s until the returned function is called.
func (w *worker) progress(out io.Writer, start time.Time) func() {
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				fmt.Fprintf(out, "%6.1fs  inserted %8d  started %8d  done %8d\n",
					now.Sub(start).Seconds(), w.inserted.Load(), w.started.Load(), w.done.Load())
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stop); <-stopped }) }
}
