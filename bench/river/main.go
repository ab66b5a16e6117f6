// Command riverbench runs the workload of `ingest-worker bench` on River
// (github.com/riverqueue/river), a PostgreSQL job queue, so that the two can
// be compared on the same machine and database; bench/compare.sh runs both.
//
// It migrates River's schema (rivermigrate), empties river_job, then:
//
//   - --mode preload inserts --jobs no-op jobs (InsertMany, in batches), then
//     starts a River client and times it from its start until the last job
//     is completed;
//   - --mode continuous starts the client, then inserts the jobs while it
//     works them, and times from the first insert to the last completion.
//
// A job counts as worked when River reports it completed (the subscription
// event follows the completer's commit), as the ingest-worker bench counts a
// task once its SUCCEEDED state is committed. Inserts use the same producers
// and batch size as the ingest-worker bench, and the client gets the same
// number of PostgreSQL connections.
//
// River's settings: --settings bench (the default) uses what River's own
// `river bench` uses, its maintainers' tuning for throughput: 2,000 workers
// on the default queue, FetchCooldown 2 ms, FetchPollInterval 20 ms;
// --settings defaults uses River's client defaults (FetchCooldown 100 ms,
// FetchPollInterval 1 s) with the 100 workers of River's README example.
//
// --fail-rate F makes the first attempt of a fraction F of the jobs (chosen
// from the job id with the ingest-worker bench's rule) return an error. River
// would retry them after its default backoff (seconds); a custom retry
// policy instead schedules the retry after the ingest-worker bench's retry
// delay, which River makes available at once (a retry due within its
// scheduler interval is not left for the scheduler). The clock runs until
// every job is completed.
//
// --handler webhook makes each job's worker POST the job to an HTTP sink
// started in the process (bench.Sink, the one `ingest-worker bench --handler
// webhook` POSTs to), with the body the ingest-worker webhook handler sends
// (webhook.Request: task_id, here the job id in decimal, kind, payload, the
// job's args, and attempt) and its headers, through one shared http.Client
// with the webhook handler's default timeout and transport. A non-2xx answer
// is an error; with --fail-rate the sink answers 500 to the first attempt of
// the jobs that the no-op worker would fail (the same rule on the same 8
// bytes of the job id).
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/ingest-worker/ingest/bench"
	"github.com/ingest-worker/ingest/webhook"
)

// River settings of --settings.
const (
	settingsBench    = "bench"
	settingsDefaults = "defaults"

	benchMaxWorkers        = 2000
	benchFetchCooldown     = 2 * time.Millisecond
	benchFetchPollInterval = 20 * time.Millisecond
	defaultsMaxWorkers     = 100
)

type options struct {
	bench.Flags
	handler      string
	databaseURL  string
	payloadBytes int
	failRate     float64
	settings     string
	maxWorkers   int
}

func (o options) validate() error {
	switch {
	case o.handler != bench.HandlerNoop && o.handler != bench.HandlerWebhook:
		return fmt.Errorf("--handler must be one of %s, got %q", strings.Join(bench.Handlers, ", "), o.handler)
	case o.databaseURL == "":
		return errors.New("--database-url is required (or set DATABASE_URL)")
	case o.settings != settingsBench && o.settings != settingsDefaults:
		return fmt.Errorf("--settings must be %s or %s, got %q", settingsBench, settingsDefaults, o.settings)
	case o.maxWorkers < 0 || o.maxWorkers > river.QueueNumWorkersMax:
		return fmt.Errorf("--max-workers must be in [0, %d], got %d", river.QueueNumWorkersMax, o.maxWorkers)
	}
	if err := o.Flags.Validate(); err != nil {
		return err
	}
	// The payload and fail rate follow the ingest-worker bench's rules.
	return bench.Options{PayloadBytes: o.payloadBytes, FailRate: o.failRate}.Validate()
}

// report is the result of a run; JobsPerSec is the figure to compare with
// the ingest-worker bench's tasks_per_second.
type report struct {
	System            string  `json:"system"`
	RiverVersion      string  `json:"river_version"`
	Mode              string  `json:"mode"`
	Jobs              int     `json:"jobs"`
	Handler           string  `json:"handler"`
	Completed         int     `json:"completed"`
	JobsPerSec        float64 `json:"jobs_per_sec"`
	WorkSeconds       float64 `json:"work_seconds"`
	InsertPerSec      float64 `json:"insert_per_sec"`
	InsertSeconds     float64 `json:"insert_seconds"`
	PayloadBytes      int     `json:"payload_bytes"`
	FailRate          float64 `json:"fail_rate"`
	FailedAttempts    int64   `json:"failed_attempts"`
	RetryDelay        string  `json:"retry_delay,omitempty"`
	SinkRequests      int64   `json:"sink_requests,omitempty"`
	SinkConnections   int64   `json:"sink_connections,omitempty"`
	Settings          string  `json:"settings"`
	MaxWorkers        int     `json:"max_workers"`
	FetchCooldown     string  `json:"fetch_cooldown"`
	FetchPollInterval string  `json:"fetch_poll_interval"`
	PoolConns         int     `json:"pool_conns"`
	Producers         int     `json:"producers"`
	InsertBatch       int     `json:"insert_batch"`
	PeakRSSMiB        float64 `json:"peak_rss_mib"`
}

func main() {
	var o options
	fs := flag.NewFlagSet("riverbench", flag.ContinueOnError)
	o.Register(fs, "jobs in river_job")
	fs.StringVar(&o.handler, "handler", bench.HandlerNoop, "the jobs' worker: "+strings.Join(bench.Handlers, " or ")+" (POST each job to an in-process HTTP sink)")
	fs.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL); River's schema is migrated there and river_job emptied")
	fs.IntVar(&o.payloadBytes, "payload-bytes", 0, "length of a string carried in each job's args (0: none)")
	fs.Float64Var(&o.failRate, "fail-rate", 0, "fraction of jobs whose first attempt returns an error (retried once, after "+bench.FailRetryDelay.String()+")")
	fs.StringVar(&o.settings, "settings", settingsBench, "River client settings: bench (those of `river bench`) or defaults (River's defaults, 100 workers)")
	fs.IntVar(&o.maxWorkers, "max-workers", 0, "workers of the default queue (0: from --settings)")
	bench.Parse("riverbench", fs, func() error { return o.validate() })
	bench.Main("riverbench", o.JSON, func(ctx context.Context) (report, error) { return run(ctx, o, os.Stderr) }, printReport)
}

// noopArgs are the jobs' args: the padding string of --payload-bytes.
type noopArgs struct {
	Pad string `json:"pad,omitempty"`
}

func (noopArgs) Kind() string { return "ingest_bench_noop" }

// noopWorker does nothing, except fail the first attempt of the jobs that
// bench.FailsFirstAttempt chooses.
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	failRate float64
	failed   *atomic.Int64
}

var errPlannedFailure = errors.New("riverbench: planned first-attempt failure")

func (w *noopWorker) Work(_ context.Context, job *river.Job[noopArgs]) error {
	if job.Attempt == 1 && w.failRate > 0 && bench.FailsFirstAttempt(binary.BigEndian.AppendUint64(nil, uint64(job.ID)), w.failRate) {
		w.failed.Add(1)
		return errPlannedFailure
	}
	return nil
}

// hookArgs are the args of the jobs of --handler webhook.
type hookArgs struct {
	Pad string `json:"pad,omitempty"`
}

func (hookArgs) Kind() string { return "ingest_bench_webhook" }

// hookRequest is the body POSTed for a job: webhook.Request's fields, with
// the job id, in decimal, for the task id.
type hookRequest struct {
	TaskID  string          `json:"task_id"`
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload"`
	Attempt int             `json:"attempt"`
}

// hookWorker POSTs each job to the sink, as the ingest-worker webhook
// handler POSTs each task: a non-2xx answer or a failed request is an
// error, which River retries.
type hookWorker struct {
	river.WorkerDefaults[hookArgs]
	client *http.Client
	url    string
	failed *atomic.Int64
}

func (w *hookWorker) Work(ctx context.Context, job *river.Job[hookArgs]) error {
	if err := w.post(ctx, job); err != nil {
		w.failed.Add(1)
		return err
	}
	return nil
}

func (w *hookWorker) post(ctx context.Context, job *river.Job[hookArgs]) error {
	id := strconv.FormatInt(job.ID, 10)
	body, err := json.Marshal(hookRequest{TaskID: id, Kind: job.Kind, Payload: job.EncodedArgs, Attempt: job.Attempt})
	if err != nil {
		return river.JobCancel(fmt.Errorf("encode job %d: %w", job.ID, err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return river.JobCancel(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", webhook.DefaultUserAgent)
	req.Header.Set(webhook.IdempotencyKeyHeader, id)
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // let the connection be reused
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("POST %s: %s", w.url, resp.Status)
	}
	return nil
}

// soonRetry retries a failed job after bench.FailRetryDelay, instead of
// River's default backoff.
type soonRetry struct{}

func (soonRetry) NextRetry(*rivertype.JobRow) time.Time { return time.Now().Add(bench.FailRetryDelay) }

func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "unknown"
}

func run(ctx context.Context, o options, progress io.Writer) (report, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	rep := report{System: "river", RiverVersion: riverVersion(), Mode: o.Mode, Jobs: o.Jobs, Handler: o.handler,
		PayloadBytes: o.payloadBytes, FailRate: o.failRate, Settings: o.settings,
		PoolConns: o.PoolConns, Producers: o.Producers, InsertBatch: o.InsertBatch}

	pc, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return rep, fmt.Errorf("--database-url: %w", err)
	}
	pc.MaxConns = int32(o.PoolConns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return rep, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)

	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return rep, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return rep, fmt.Errorf("migrate River's schema: %w", err)
	}
	// RESTART IDENTITY: ids start at 1 again, so a fail rate fails the same
	// jobs in every run.
	const empty = `TRUNCATE river_job RESTART IDENTITY`
	if _, err := pool.Exec(ctx, empty); err != nil {
		return rep, fmt.Errorf("empty river_job: %w", err)
	}
	if !o.Keep {
		defer func() {
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer ccancel()
			_, _ = pool.Exec(cctx, empty)
		}()
	}

	rep.MaxWorkers = defaultsMaxWorkers
	if o.settings == settingsBench {
		rep.MaxWorkers = benchMaxWorkers
	}
	if o.maxWorkers > 0 {
		rep.MaxWorkers = o.maxWorkers
	}
	var failed atomic.Int64
	workers := river.NewWorkers()
	var sink *bench.Sink
	if o.handler == bench.HandlerWebhook {
		if sink, err = bench.StartSink(o.failRate); err != nil {
			return rep, err
		}
		defer sink.Close()
		// The ingest-worker webhook handler's own client: its default
		// timeout and its transport, keeping an idle connection to the
		// host per worker (webhook.IdleConnsFor).
		client := &http.Client{Timeout: webhook.DefaultTimeout, Transport: webhook.Transport(webhook.IdleConnsFor(rep.MaxWorkers))}
		err = river.AddWorkerSafely(workers, &hookWorker{client: client, url: sink.URL(), failed: &failed})
	} else {
		err = river.AddWorkerSafely(workers, &noopWorker{failRate: o.failRate, failed: &failed})
	}
	if err != nil {
		return rep, err
	}
	cfg := &river.Config{
		Logger:  slog.New(slog.NewTextHandler(progress, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Workers: workers,
	}
	if o.settings == settingsBench {
		cfg.FetchCooldown, cfg.FetchPollInterval = benchFetchCooldown, benchFetchPollInterval
	}
	cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: rep.MaxWorkers}}
	if o.failRate > 0 {
		cfg.RetryPolicy = soonRetry{}
		rep.RetryDelay = bench.FailRetryDelay.String() + ", custom retry policy; River makes the job available at once"
	}
	rep.FetchCooldown = durationOr(cfg.FetchCooldown, river.FetchCooldownDefault)
	rep.FetchPollInterval = durationOr(cfg.FetchPollInterval, river.FetchPollIntervalDefault)
	client, err := river.NewClient(driver, cfg)
	if err != nil {
		return rep, err
	}

	// Every completion arrives on the subscription, which drops events only
	// when its buffer is full: one place per job.
	events, unsubscribe := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: o.Jobs, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer unsubscribe()
	var completed, inserted atomic.Int64
	allDone := make(chan struct{})
	go func() {
		for ev := range events {
			if ev.Kind == river.EventKindJobCompleted && completed.Add(1) == int64(o.Jobs) {
				close(allDone)
			}
		}
	}()

	fmt.Fprintf(progress, "riverbench: River %s, settings %s (%d workers, fetch cooldown %s, poll %s; %d connections): %d jobs, %s mode, handler %s",
		rep.RiverVersion, o.settings, rep.MaxWorkers, rep.FetchCooldown, rep.FetchPollInterval, o.PoolConns, o.Jobs, o.Mode, o.handler)
	if sink != nil {
		fmt.Fprintf(progress, " → %s", sink.URL())
	}
	if o.payloadBytes > 0 {
		fmt.Fprintf(progress, ", payload +%d bytes", o.payloadBytes)
	}
	if o.failRate > 0 {
		fmt.Fprintf(progress, ", fail rate %g (retry: %s)", o.failRate, rep.RetryDelay)
	}
	fmt.Fprintln(progress)
	runStart := time.Now()
	stopProgress := printProgress(progress, runStart, &inserted, &completed)
	defer stopProgress()

	var insertStart, insertEnd, workStart time.Time
	insert := func() error {
		err := insertJobs(ctx, client, o, &inserted)
		insertEnd = time.Now()
		return err
	}
	stopClient := func() {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer scancel()
		_ = client.Stop(sctx)
	}
	if o.Mode == "preload" {
		insertStart = time.Now()
		if err := insert(); err != nil {
			return rep, err
		}
		workStart = time.Now()
		if err := client.Start(ctx); err != nil {
			return rep, err
		}
		defer stopClient()
	} else {
		if err := client.Start(ctx); err != nil {
			return rep, err
		}
		defer stopClient()
		insertStart = time.Now()
		workStart = insertStart
		if err := insert(); err != nil {
			return rep, err
		}
	}
	select {
	case <-allDone:
	case <-ctx.Done():
		return rep, fmt.Errorf("timed out or interrupted with %d of %d jobs completed: %w", completed.Load(), o.Jobs, ctx.Err())
	}
	workEnd := time.Now()
	stopProgress()

	// Verify in SQL what the subscription reported.
	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer vcancel()
	if err := pool.QueryRow(vctx, `SELECT count(*) FROM river_job WHERE state = 'completed'`).Scan(&rep.Completed); err != nil {
		return rep, fmt.Errorf("count completed jobs: %w", err)
	}
	if rep.Completed != o.Jobs {
		return rep, fmt.Errorf("%d of %d jobs are completed in river_job", rep.Completed, o.Jobs)
	}
	rep.InsertSeconds = insertEnd.Sub(insertStart).Seconds()
	rep.WorkSeconds = workEnd.Sub(workStart).Seconds()
	rep.InsertPerSec = float64(o.Jobs) / rep.InsertSeconds
	rep.JobsPerSec = float64(o.Jobs) / rep.WorkSeconds
	rep.FailedAttempts = failed.Load()
	if sink != nil {
		rep.SinkRequests, rep.SinkConnections = sink.Requests(), sink.Connections()
	}
	rep.PeakRSSMiB = float64(bench.PeakRSS()) / (1 << 20)
	return rep, nil
}

func durationOr(d, def time.Duration) string {
	if d == 0 {
		d = def
	}
	return d.String()
}

// insertJobs inserts o.Jobs jobs with o.Producers goroutines, o.InsertBatch
// jobs per InsertMany.
func insertJobs(ctx context.Context, client *river.Client[pgx.Tx], o options, inserted *atomic.Int64) error {
	var args river.JobArgs = noopArgs{Pad: bench.Pad(o.payloadBytes)}
	if o.handler == bench.HandlerWebhook {
		args = hookArgs{Pad: bench.Pad(o.payloadBytes)}
	}
	return bench.Produce(ctx, o.Jobs, o.InsertBatch, o.Producers, func(ctx context.Context, n int) error {
		params := make([]river.InsertManyParams, n)
		for i := range params {
			params[i] = river.InsertManyParams{Args: args}
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return fmt.Errorf("insert %d jobs: %w", n, err)
		}
		inserted.Add(int64(n))
		return nil
	})
}

// printProgress prints a line every 2 s until the returned function is
// called.
func printProgress(w io.Writer, start time.Time, inserted, completed *atomic.Int64) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		var lastIns, lastOK int64
		last := start
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				ins, ok := inserted.Load(), completed.Load()
				dt := now.Sub(last).Seconds()
				fmt.Fprintf(w, "%6.1fs  inserted %8d (%7.0f/s)  completed %8d (%7.0f/s)\n",
					now.Sub(start).Seconds(), ins, float64(ins-lastIns)/dt, ok, float64(ok-lastOK)/dt)
				lastIns, lastOK, last = ins, ok, now
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			<-done
		})
	}
}

func printReport(w io.Writer, r report) {
	fmt.Fprintf(w, "\nRESULT  River %s, %s, %d jobs, handler %s, %d workers (settings %s: fetch cooldown %s, poll %s)\n",
		r.RiverVersion, r.Mode, r.Jobs, r.Handler, r.MaxWorkers, r.Settings, r.FetchCooldown, r.FetchPollInterval)
	fmt.Fprintf(w, "jobs/s worked    %.0f  (%d completed in %.2fs)\n", r.JobsPerSec, r.Completed, r.WorkSeconds)
	fmt.Fprintf(w, "jobs/s inserted  %.0f  (%.2fs)\n", r.InsertPerSec, r.InsertSeconds)
	if r.PayloadBytes > 0 {
		fmt.Fprintf(w, "payload padding  %d bytes\n", r.PayloadBytes)
	}
	if r.FailRate > 0 {
		fmt.Fprintf(w, "fail rate        %g  (%d first attempts failed; retry: %s)\n", r.FailRate, r.FailedAttempts, r.RetryDelay)
	}
	if r.SinkRequests > 0 {
		fmt.Fprintf(w, "webhook sink     %d requests  (%d connections)\n", r.SinkRequests, r.SinkConnections)
	}
	fmt.Fprintf(w, "peak RSS         %.0f MiB\n", r.PeakRSSMiB)
}
