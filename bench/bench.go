// Package bench measures ingest-worker's full production path: tasks are
// created in Postgres (task row, QUEUED audit row and outbox row in one
// transaction per batch), published by the outbox relay to a Redis stream,
// read by the consumer, started (RUNNING + audit), handled by a no-op or
// fixed-sleep handler, or by the binary's webhook handler POSTing to an
// in-process HTTP sink (Options.Handler, Sink), and completed (SUCCEEDED +
// audit, XACK), by one ingest.Service, exactly as `ingest-worker run` does.
//
// It reports tasks worked and inserted per second, latency percentiles of
// commit→handler start and commit→SUCCEEDED, SQL statements and Redis round
// trips per task (counted by a pgx tracer and a go-redis hook on the
// clients the path uses) and the peak resident memory of the process.
// `ingest-worker bench` wraps it. Options.PayloadBytes pads each payload and
// Options.FailRate fails first attempts; FailsFirstAttempt, Pad, Sink and
// the insert and pool defaults are also what the River comparison
// (bench/river) uses, so that both sides run the same workload.
//
// Options.Sample adds a series to the report, a Sample per period:
// throughput, latency, the rescuer's page time (RescueProbe), the
// tables' row versions and sizes, the slowest statements. Options.Hold
// holds two transactions open for part of the run (HoldSummary compares
// the periods), Options.Retention runs retention as production does, and
// Options.Soak also times the dashboard's and the API's routes
// (SoakRoutes): the measurements of a held transaction and of a long soak.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/hook"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/webhook"
)

// Defaults of Options.
const (
	DefaultTasks          = 2000
	DefaultConcurrency    = 1000
	DefaultReadCount      = 500
	DefaultCompleteBatch  = 1000
	DefaultCompleteWindow = 2 * time.Millisecond
	DefaultRelayBatch     = 1000
	DefaultInsertBatch    = 1000
	DefaultProducers      = 2
	DefaultProgress       = 2 * time.Second
	DefaultTimeout        = 30 * time.Minute
	DefaultPoolConns      = 16
	// MaxPayloadBytes bounds Options.PayloadBytes.
	MaxPayloadBytes = 1 << 20
	// MaxPoolConns bounds Options.PoolConns (pgx keeps it as an int32).
	MaxPoolConns = 10000
)

// Handlers of Options.Handler.
const (
	// HandlerNoop returns at once (or after Options.HandlerSleep).
	HandlerNoop = "noop"
	// HandlerWebhook is the binary's webhook handler (package webhook,
	// configured as `ingest-worker run` configures it, with the default
	// timeout and HTTP client) POSTing each task to a Sink the run starts.
	HandlerWebhook = "webhook"
)

// Handlers lists the values of Options.Handler.
var Handlers = []string{HandlerNoop, HandlerWebhook}

// Retry timing of runs with a FailRate: a failed first attempt is due again
// after FailRetryDelay (the task store's backoff, base = max, no jitter),
// so that the run measures work rather than waiting for retries to fall
// due. The worker runs each retry again itself when it falls due (the
// reclaimer keeps its default interval).
const FailRetryDelay = time.Millisecond

// Options configures a run. Zero fields take the Default* values.
type Options struct {
	// Listen is where the service's LISTEN connections come from
	// (ingest.Config.Listen): the binary's INGEST_DATABASE_LISTEN_URL,
	// or none behind a pooler.
	Listen pgsession.Source
	// Tasks is how many tasks are created and worked.
	Tasks int
	// Preload inserts every task first, then starts the worker and times
	// it working them off. Otherwise (continuous) tasks are inserted and
	// worked at the same time.
	Preload bool
	// PublishFirst, with Preload, publishes the tasks to the stream as
	// they are inserted (a relay runs, the workers do not), so the timed
	// work starts from a backlog in Redis: a service whose workers fell
	// behind its producers, its relays keeping up. Without it the backlog
	// is outbox rows, which the relay publishes during the timed work: a
	// backlog that built up while no relay ran.
	PublishFirst bool
	// Rate, in continuous mode, is the offered load in tasks/s (0: insert
	// as fast as the producers can).
	Rate float64
	// InsertBatch is the number of tasks per CreateBatch transaction (in
	// continuous mode with a Rate, smaller batches are used so that a
	// batch goes in every 5 ms).
	InsertBatch int
	// Producers is the number of concurrent inserting goroutines.
	Producers int
	// Handler is what handles the tasks: HandlerNoop (the default) or
	// HandlerWebhook.
	Handler string
	// HandlerSleep is the no-op handler's fixed work time (0: none).
	HandlerSleep time.Duration
	// PayloadBytes is the length of a string carried in each task's
	// payload (0: none), see Pad.
	PayloadBytes int
	// FailRate is the fraction of tasks whose first attempt returns an
	// error, so they are retried once (decided by FailsFirstAttempt from
	// the task id).
	FailRate float64
	// KindConcurrency and KindRate limit the run's task kind across the
	// workers (task.Store.SetKind; 0 and the zero Rate: no limit), to
	// measure the cost of the limiter.
	KindConcurrency int
	KindRate        task.Rate
	// Worker tuning: handler slots, entries per stream read, completer
	// batch and window, outbox relay batch.
	Concurrency    int
	ReadCount      int
	CompleteBatch  int
	CompleteWindow time.Duration
	RelayBatch     int
	// PoolConns is the maximum size of the (traced) connection pool of the
	// path.
	PoolConns int
	// Progress is the period of progress lines (negative: none).
	Progress time.Duration
	// Timeout bounds the run.
	Timeout time.Duration
	// Keep leaves the run's tasks in Postgres and its stream in Redis
	// (otherwise they are deleted at the end).
	Keep bool
	// Logger receives the worker's logs (nil: none).
	Logger *slog.Logger
	// Keyring encrypts the run's payloads and results (nil: none), to
	// measure the cost of encryption at rest.
	Keyring *seal.Keyring

	// Sample, when > 0, is the period of the run's series
	// (Report.Series): throughput, latency, the rescuer's page time, the
	// tables' row versions and the slowest statements of each period
	// (default DefaultHoldSample with Hold, DefaultSoakSample with Soak).
	Sample time.Duration
	// SeriesOut, when set, receives the series as CSV, a row per period
	// as it ends.
	SeriesOut io.Writer
	// Hold, when > 0, holds two transactions open for that long from
	// HoldAfter into the run: one idle in transaction after taking a
	// transaction id, one REPEATABLE READ reader after its first read.
	// Together they hold back the xmin horizon, so vacuum removes no row
	// version that died after they began (see HoldSummary).
	Hold      time.Duration
	HoldAfter time.Duration
	// Retention, when > 0, runs the maintainer's retention as production
	// does, with SUCCEEDED tasks and SENT outbox rows deleted this long
	// after they finished (and the run's stream trimmed), a pass every
	// min(Retention, 10s). It deletes every task of the database past the
	// window, not only the run's: use it on a database of its own.
	Retention time.Duration
	// Soak also samples the tables' and indexes' sizes and times the
	// routes of SoakRoutes in each period.
	Soak bool
}

// Sample periods by default.
const (
	DefaultHoldSample = 10 * time.Second
	DefaultSoakSample = 30 * time.Second
)

// WithDefaults returns the configuration with every zero field set to
// its default.
func (o Options) WithDefaults() Options {
	o.Tasks = cmp.Or(o.Tasks, DefaultTasks)
	o.Handler = cmp.Or(o.Handler, HandlerNoop)
	o.Concurrency = cmp.Or(o.Concurrency, DefaultConcurrency)
	o.ReadCount = cmp.Or(o.ReadCount, DefaultReadCount)
	o.CompleteBatch = cmp.Or(o.CompleteBatch, DefaultCompleteBatch)
	o.RelayBatch = cmp.Or(o.RelayBatch, DefaultRelayBatch)
	o.InsertBatch = cmp.Or(o.InsertBatch, DefaultInsertBatch)
	o.Producers = cmp.Or(o.Producers, DefaultProducers)
	o.PoolConns = cmp.Or(o.PoolConns, DefaultPoolConns)
	o.CompleteWindow = cmp.Or(o.CompleteWindow, DefaultCompleteWindow)
	o.Progress = cmp.Or(o.Progress, DefaultProgress)
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout)
	if o.Sample == 0 && o.Soak {
		o.Sample = DefaultSoakSample
	}
	if o.Sample == 0 && o.Hold > 0 {
		o.Sample = DefaultHoldSample
	}
	return o
}

// Validate names the first bad option.
func (o Options) Validate() error {
	o = o.WithDefaults()
	switch {
	case o.Tasks < 1:
		return fmt.Errorf("tasks must be >= 1, got %d", o.Tasks)
	case !(o.Rate >= 0): // also refuses NaN
		return fmt.Errorf("rate must be >= 0, got %v", o.Rate)
	case o.Preload && o.Rate > 0:
		return errors.New("rate applies to continuous mode only, not with preload")
	case o.PublishFirst && !o.Preload:
		return errors.New("publish-first applies to preload mode only")
	case o.InsertBatch < 1 || o.InsertBatch > 10000:
		return fmt.Errorf("insert batch must be in [1, 10000], got %d", o.InsertBatch)
	case o.Producers < 1 || o.Producers > 64:
		return fmt.Errorf("producers must be in [1, 64], got %d", o.Producers)
	case o.Handler != HandlerNoop && o.Handler != HandlerWebhook:
		return fmt.Errorf("handler must be one of %s, got %q", strings.Join(Handlers, ", "), o.Handler)
	case o.HandlerSleep < 0:
		return fmt.Errorf("handler sleep must be >= 0, got %s", o.HandlerSleep)
	case o.HandlerSleep > 0 && o.Handler != HandlerNoop:
		return fmt.Errorf("handler sleep applies to the %s handler only, not to %s", HandlerNoop, o.Handler)
	case o.PayloadBytes < 0 || o.PayloadBytes > MaxPayloadBytes:
		return fmt.Errorf("payload bytes must be in [0, %d], got %d", MaxPayloadBytes, o.PayloadBytes)
	case !(o.FailRate >= 0 && o.FailRate < 1): // also refuses NaN
		return fmt.Errorf("fail rate must be in [0, 1), got %v", o.FailRate)
	case o.PoolConns < 4 || o.PoolConns > MaxPoolConns:
		return fmt.Errorf("pool conns must be in [4, %d], got %d", MaxPoolConns, o.PoolConns)
	case o.KindConcurrency < 0 || o.KindConcurrency > task.MaxConcurrency:
		return fmt.Errorf("kind concurrency must be in [0, %d], got %d", task.MaxConcurrency, o.KindConcurrency)
	case o.Sample < 0 || (o.Sample > 0 && o.Sample < 100*time.Millisecond):
		return fmt.Errorf("sample must be 0 or at least 100ms, got %s", o.Sample)
	case o.Hold < 0 || o.HoldAfter < 0:
		return fmt.Errorf("hold and hold-after must be >= 0, got %s and %s", o.Hold, o.HoldAfter)
	case o.HoldAfter > 0 && o.Hold == 0:
		return errors.New("hold-after applies with a hold only")
	case o.Retention < 0 || (o.Retention > 0 && o.Retention < time.Millisecond):
		return fmt.Errorf("retention must be 0 or at least 1ms, got %s", o.Retention)
	}
	return nil
}

// Report is the result of a run.
type Report struct {
	Mode        string  `json:"mode"` // preload or continuous
	Tasks       int     `json:"tasks"`
	Succeeded   int     `json:"succeeded"`
	OfferedRate float64 `json:"offered_rate,omitempty"`
	// Handler is "noop", "sleep <duration>" or "webhook"; HandlerSleep
	// the no-op handler's sleep ("none" without).
	Handler      string  `json:"handler"`
	HandlerSleep string  `json:"handler_sleep"`
	Concurrency  int     `json:"concurrency"`
	PayloadBytes int     `json:"payload_bytes"`
	FailRate     float64 `json:"fail_rate"`
	// FailedAttempts is how many first attempts failed as FailRate asked
	// (with the webhook handler: how many attempts it failed, for any
	// reason); RetryDelay says how soon they ran again (empty without
	// failures).
	FailedAttempts int64  `json:"failed_attempts"`
	RetryDelay     string `json:"retry_delay,omitempty"`
	// SinkRequests and SinkConnections, with the webhook handler, count
	// the requests and connections the sink received: SinkRequests is
	// Tasks + FailedAttempts when no request was lost on the way.
	SinkRequests    int64 `json:"sink_requests,omitempty"`
	SinkConnections int64 `json:"sink_connections,omitempty"`

	// TasksPerSecond is tasks SUCCEEDED per second of the work phase
	// (preload: from the worker's start to the last completion;
	// continuous: from the first insert to the last completion).
	TasksPerSecond float64 `json:"tasks_per_second"`
	// InsertPerSecond is tasks committed per second of the insert phase.
	InsertPerSecond float64 `json:"insert_per_second"`
	WorkSeconds     float64 `json:"work_seconds"`
	InsertSeconds   float64 `json:"insert_seconds"`

	LatencyMS struct {
		Start Percentiles `json:"start"` // commit → handler start
		Done  Percentiles `json:"done"`  // commit → SUCCEEDED committed
	} `json:"latency_ms"`

	// SQLStatements and RedisRoundTrips count the whole run (inserts
	// included); the per-task figures divide them by Tasks.
	SQLStatements      int64            `json:"sql_statements"`
	SQLPerTask         float64          `json:"sql_statements_per_task"`
	RedisRoundTrips    int64            `json:"redis_round_trips"`
	RedisPerTask       float64          `json:"redis_round_trips_per_task"`
	StatementCounts    map[string]int64 `json:"statement_counts"`
	RedisCommandCounts map[string]int64 `json:"redis_command_counts"`

	// PeakRSSMiB is this process's peak resident set (VmHWM, or the largest
	// VmRSS sampled for MemoryAtPeak where that reads higher: the kernel
	// syncs the counters behind both lazily): the worker, the producers
	// and the bench's bookkeeping together.
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// MemoryAtPeak is where the resident set went when it was largest.
	MemoryAtPeak MemoryAtPeak `json:"memory_at_peak"`
	// WAL is what the PostgreSQL server wrote to its WAL from before the
	// first insert until the last task SUCCEEDED (see WAL); WALWork, in
	// preload mode, the part written after the inserts.
	WAL     WALUsage  `json:"wal"`
	WALWork *WALUsage `json:"wal_work,omitempty"`
	// MaxInFlight is the most tasks started and not yet SUCCEEDED at once.
	MaxInFlight int64 `json:"max_in_flight"`

	// Series is a sample per Options.Sample (none without).
	Series []Sample `json:"series,omitempty"`
	// Hold compares the periods with and without Options.Hold's
	// transactions open.
	Hold *HoldSummary `json:"hold,omitempty"`
	// RetentionDeleted is how many tasks retention deleted during the run
	// (with Options.Retention).
	RetentionDeleted int64 `json:"retention_deleted,omitempty"`
}

// Run runs one benchmark on the database of pool (migrated) and the Redis
// of rdb, writing progress lines to out, and returns the report. The path
// runs on a pool of its own, built from pool's configuration with a
// statement counter; rdb gets a round-trip counting hook. Keys and task
// kinds are unique to the run, so it may share servers with real workers.
func Run(ctx context.Context, opts Options, pool *pgxpool.Pool, rdb redis.UniversalClient, out io.Writer) (Report, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return Report{}, err
	}
	if out == nil {
		out = io.Discard
	}
	out = &lockedWriter{w: out} // progress, samples and the hold write lines
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()

	counters := &Counters{}
	pc := pool.Config()
	pc.ConnConfig.Tracer = counters
	pc.MaxConns = int32(opts.PoolConns)
	pc.MinConns = int32(min(opts.PoolConns, 8))
	traced, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return Report{}, fmt.Errorf("connect the traced pool: %w", err)
	}
	defer traced.Close()
	rdb.AddHook(counters.RedisHook())

	b := &run{opts: opts, pool: pool, traced: traced, rdb: rdb, out: out, counters: counters, track: newTracker()}
	b.id = randomID()
	b.kind = "bench." + b.id
	b.stream = "ingest-bench:{" + b.id + "}:tasks"
	b.dlq = "ingest-bench:{" + b.id + "}:dlq"
	defer b.cleanup()
	return b.run(ctx)
}

type run struct {
	opts     Options
	pool     *pgxpool.Pool // untraced: the bench's own queries
	traced   *pgxpool.Pool // the path's
	rdb      redis.UniversalClient
	out      io.Writer
	counters *Counters
	track    *tracker

	id, kind, stream, dlq string

	inserted  atomic.Int64
	started   atomic.Int64
	failed    atomic.Int64
	succeeded atomic.Int64
	maxFlight atomic.Int64
	// webhook is the webhook handler, with the webhook Handler.
	webhook  ingest.Handler
	allDone  chan struct{}
	doneOnce sync.Once
	// series samples the run (Options.Sample); lastSnap is the counters
	// at its previous sample.
	series   *series
	lastSnap Snapshot
}

// lockedWriter serialises the writes of several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// FailsFirstAttempt reports whether the task or job identified by id
// fails its first attempt in a run with the given fail rate: the first 8
// bytes of the SHA-256 of id, as a fraction of 2^64, are below rate. The
// same id always gives the same answer, so a run's failures are
// reproducible, and ids that differ in one byte are as good as unrelated.
func FailsFirstAttempt(id []byte, rate float64) bool {
	sum := sha256.Sum256(id)
	return float64(binary.BigEndian.Uint64(sum[:])>>11)/(1<<53) < rate
}

// Pad returns the string of n bytes that a task's payload carries with
// Options.PayloadBytes = n.
func Pad(n int) string { return strings.Repeat("x", n) }

// errPlannedFailure is what a first attempt chosen by FailsFirstAttempt
// returns.
var errPlannedFailure = errors.New("bench: planned first-attempt failure")

func (b *run) serviceConfig() ingest.Config {
	o := b.opts
	cfg := ingest.Config{
		Stream: b.stream, DLQ: b.dlq, Consumer: "bench-" + b.id, Group: "bench",
		Concurrency: o.Concurrency, ReadCount: o.ReadCount,
		CompleteBatch: o.CompleteBatch, CompleteWindow: o.CompleteWindow,
		Block: 200 * time.Millisecond, ShutdownTimeout: 10 * time.Second,
		Store:       b.storeConfig(),
		Reclaim:     reclaim.Config{BatchSize: 1000},
		Relay:       outbox.RelayConfig{BatchSize: o.RelayBatch},
		Maintenance: maintenance.Config{Retention: maintenance.RetentionConfig{DisableTrim: true}},
		Listen:      o.Listen,
	}
	if o.Retention > 0 {
		cfg.Maintenance.Retention = maintenance.RetentionConfig{
			Tasks:    task.Windows{Succeeded: o.Retention},
			Interval: min(o.Retention, 10*time.Second), Streams: []string{b.stream},
		}
	}
	return cfg
}

// storeConfig is the task store's configuration: with a FailRate, failed
// attempts are due again after FailRetryDelay.
func (b *run) storeConfig() task.Config {
	cfg := task.Config{Stream: b.stream, Keyring: b.opts.Keyring}
	if b.opts.FailRate > 0 {
		cfg.Backoff = task.Backoff{Base: FailRetryDelay, Max: FailRetryDelay}
	}
	return cfg
}

func (b *run) onSucceeded(ids []uuid.UUID) {
	b.track.succeeded(ids, time.Now())
	if n := b.succeeded.Add(int64(len(ids))); n >= int64(b.opts.Tasks) {
		b.doneOnce.Do(func() { close(b.allDone) })
	}
}

func (b *run) handler(ctx context.Context, t ingest.Task) error {
	b.track.started(t.ID, time.Now())
	flight := b.started.Add(1) - b.failed.Load() - b.succeeded.Load()
	for {
		m := b.maxFlight.Load()
		if flight <= m || b.maxFlight.CompareAndSwap(m, flight) {
			break
		}
	}
	if b.webhook != nil {
		err := b.webhook(ctx, t)
		if err != nil {
			b.failed.Add(1)
		}
		return err
	}
	if d := b.opts.HandlerSleep; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if t.Attempt == 1 && b.opts.FailRate > 0 && FailsFirstAttempt(t.ID[:], b.opts.FailRate) {
		b.failed.Add(1)
		return errPlannedFailure
	}
	return nil
}

func (b *run) run(ctx context.Context) (Report, error) {
	o := b.opts
	b.allDone = make(chan struct{})
	rep := Report{Mode: "continuous", Tasks: o.Tasks, OfferedRate: o.Rate, Concurrency: o.Concurrency,
		Handler: o.Handler, HandlerSleep: "none", PayloadBytes: o.PayloadBytes, FailRate: o.FailRate}
	if o.Preload {
		rep.Mode = "preload"
		if o.PublishFirst {
			rep.Mode = "preload-published"
		}
	}
	if o.HandlerSleep > 0 {
		rep.HandlerSleep = o.HandlerSleep.String()
		rep.Handler = "sleep " + rep.HandlerSleep
	}
	handlerShown := rep.Handler
	var sink *Sink
	if o.Handler == HandlerWebhook {
		var err error
		if sink, err = StartSink(o.FailRate); err != nil {
			return rep, err
		}
		defer sink.Close()
		// As `ingest-worker run` configures it: the default timeout and
		// HTTP client, keeping an idle connection per handler slot.
		if b.webhook, err = webhook.New(webhook.Config{URL: sink.URL(), IdleConns: webhook.IdleConnsFor(o.Concurrency)}); err != nil {
			return rep, err
		}
		handlerShown += " → " + sink.URL()
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	svc, err := ingest.NewService(b.serviceConfig(), b.traced, ingest.Redis(b.rdb), logger, reg)
	if err != nil {
		return rep, err
	}
	store := svc.Store()
	svc.Handle(b.kind, b.handler)
	if o.KindConcurrency > 0 || o.KindRate.Count > 0 {
		if _, err := store.SetKind(ctx, "bench", b.kind, task.KindUpdate{Concurrency: &o.KindConcurrency, Rate: &o.KindRate}); err != nil {
			return rep, err
		}
		fmt.Fprintf(b.out, "kind %s limited: concurrency %d, rate %s\n", b.kind, o.KindConcurrency, o.KindRate)
	}

	fmt.Fprintf(b.out, "bench %s: %d tasks, %s mode", b.id, o.Tasks, rep.Mode)
	if o.Rate > 0 {
		fmt.Fprintf(b.out, " at %.0f tasks/s offered", o.Rate)
	}
	fmt.Fprintf(b.out, ", handler %s, concurrency %d, read count %d, complete batch %d/%s, relay batch %d",
		handlerShown, o.Concurrency, o.ReadCount, o.CompleteBatch, o.CompleteWindow, o.RelayBatch)
	if o.PayloadBytes > 0 {
		fmt.Fprintf(b.out, ", payload +%d bytes", o.PayloadBytes)
	}
	if o.FailRate > 0 {
		rep.RetryDelay = fmt.Sprintf("%s backoff", FailRetryDelay)
		fmt.Fprintf(b.out, ", fail rate %g (retry: %s)", o.FailRate, rep.RetryDelay)
	}
	fmt.Fprintln(b.out)

	walStart, err := SettledWAL(ctx, b.pool)
	if err != nil {
		return rep, err
	}
	before := b.counters.Snapshot()
	b.lastSnap = before
	runStart := time.Now()
	stopMemory := sampleMemory(200 * time.Millisecond)
	defer stopMemory()
	stopProgress := b.progress(runStart)
	defer stopProgress()
	stopSeries, err := b.startSeries(ctx, reg, runStart)
	if err != nil {
		return rep, err
	}
	defer stopSeries()

	var insertStart, insertEnd time.Time
	svcCtx, stopSvc := context.WithCancel(ctx)
	svcDone := make(chan error, 1)
	startService := func() { go func() { svcDone <- svc.Run(hook.WithOnSucceeded(svcCtx, b.onSucceeded)) }() }
	stopService := func() error {
		stopSvc()
		return <-svcDone
	}

	var workStart time.Time
	var walWork *WAL // preload: the WAL after the inserts
	if o.Preload {
		insertStart = time.Now()
		if o.PublishFirst {
			if err := b.insertPublished(ctx, logger); err != nil {
				return rep, err
			}
		} else if err := b.insert(ctx, store, 0); err != nil {
			return rep, err
		}
		insertEnd = time.Now()
		w, err := SettledWAL(ctx, b.pool)
		if err != nil {
			return rep, err
		}
		walWork = &w
		workStart = time.Now()
		startService()
	} else {
		startService()
		insertStart = time.Now()
		workStart = insertStart
		errc := make(chan error, 1)
		go func() {
			err := b.insert(ctx, store, o.Rate)
			insertEnd = time.Now()
			if b.series != nil {
				b.series.inserting.Store(false)
			}
			errc <- err
		}()
		select {
		case err := <-errc:
			if err != nil {
				_ = stopService()
				return rep, err
			}
		case err := <-svcDone:
			return rep, fmt.Errorf("worker stopped: %v", err)
		}
	}
	select {
	case <-b.allDone:
	case err := <-svcDone:
		return rep, fmt.Errorf("worker stopped: %v", err)
	case <-ctx.Done():
		_ = stopService()
		return rep, fmt.Errorf("timed out or interrupted with %d of %d tasks SUCCEEDED: %w", b.succeeded.Load(), o.Tasks, ctx.Err())
	}
	workEnd := time.Now()
	after := b.counters.Snapshot()
	stopProgress()
	if s := stopSeries(); s != nil {
		rep.Series, rep.Hold = s.samples, s.holdSummary()
	}
	if err := stopService(); err != nil {
		return rep, fmt.Errorf("worker: %w", err)
	}
	walEnd, err := SettledWAL(ctx, b.pool)
	if err != nil {
		return rep, err
	}
	rep.WAL = walStart.Usage(walEnd, o.Tasks)
	if walWork != nil {
		u := walWork.Usage(walEnd, o.Tasks)
		rep.WALWork = &u
	}

	// Verify in SQL what the hook reported: with retention, the tasks
	// still there are SUCCEEDED and, with those it deleted, all of them.
	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer vcancel()
	if err := b.pool.QueryRow(vctx, `SELECT count(*) FROM ingest_task WHERE kind = $1 AND status = $2`, b.kind, string(task.Succeeded)).Scan(&rep.Succeeded); err != nil {
		return rep, fmt.Errorf("count SUCCEEDED tasks: %w", err)
	}
	if o.Retention > 0 {
		// Every task's success was seen (allDone), the tasks left are all
		// SUCCEEDED, and nothing but retention deletes the run's tasks (the
		// kind is the run's own): the others were deleted by retention.
		// They are counted here rather than by its metric, which misses a
		// batch whose commit was not answered before the leader stopped.
		var left int
		if err := b.pool.QueryRow(vctx, `SELECT count(*) FROM ingest_task WHERE kind = $1`, b.kind).Scan(&left); err != nil {
			return rep, fmt.Errorf("count tasks: %w", err)
		}
		if seen := b.succeeded.Load(); left != rep.Succeeded || seen < int64(o.Tasks) {
			return rep, fmt.Errorf("%d of the run's tasks are left, %d of them SUCCEEDED; %d successes seen, of %d", left, rep.Succeeded, seen, o.Tasks)
		}
		rep.RetentionDeleted = int64(o.Tasks - left)
		rep.Succeeded = int(b.succeeded.Load())
	} else if rep.Succeeded != o.Tasks {
		return rep, fmt.Errorf("%d of %d tasks are SUCCEEDED in Postgres", rep.Succeeded, o.Tasks)
	}

	rep.InsertSeconds = insertEnd.Sub(insertStart).Seconds()
	rep.WorkSeconds = workEnd.Sub(workStart).Seconds()
	rep.InsertPerSecond = float64(o.Tasks) / rep.InsertSeconds
	rep.TasksPerSecond = float64(o.Tasks) / rep.WorkSeconds
	rep.LatencyMS.Start = b.track.start.percentiles()
	rep.LatencyMS.Done = b.track.done.percentiles()
	d := after.Sub(before)
	rep.SQLStatements, rep.RedisRoundTrips = d.SQL, d.Redis
	rep.SQLPerTask = float64(d.SQL) / float64(o.Tasks)
	rep.RedisPerTask = float64(d.Redis) / float64(o.Tasks)
	rep.StatementCounts, rep.RedisCommandCounts = d.ByStatement, d.ByCommand
	rep.MemoryAtPeak = stopMemory()
	rep.PeakRSSMiB = max(float64(PeakRSS())/(1<<20), rep.MemoryAtPeak.RSSMiB)
	rep.MaxInFlight = b.maxFlight.Load()
	rep.FailedAttempts = b.failed.Load()
	if sink != nil {
		rep.SinkRequests, rep.SinkConnections = sink.Requests(), sink.Connections()
	}
	return rep, nil
}

// insertPublished is the insert phase of PublishFirst: it creates the
// tasks through a store that publishes them after commit with a relay of
// the service's configuration, and returns once the stream holds them all.
func (b *run) insertPublished(ctx context.Context, logger *slog.Logger) error {
	cfg := b.serviceConfig().WithDefaults()
	relay, err := outbox.NewRelay(cfg.Relay, b.traced, b.rdb, logger, nil)
	if err != nil {
		return err
	}
	store, err := task.NewStore(b.storeConfig(), b.traced, task.PublishWith(outbox.NewWriter(relay, outbox.PublishAfterCommit)))
	if err != nil {
		return err
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	defer func() {
		stopRelay()
		<-relayDone
	}()
	if err := b.insert(ctx, store, 0); err != nil {
		return err
	}
	for {
		n, err := b.rdb.XLen(ctx, b.stream).Result()
		if err != nil {
			return fmt.Errorf("publish first: %w", err)
		}
		if n >= int64(b.opts.Tasks) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish first: %d of %d tasks in the stream: %w", n, b.opts.Tasks, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// insert creates opts.Tasks tasks with the producers, at rate tasks/s in
// total (0: as fast as they can).
func (b *run) insert(ctx context.Context, store *task.Store, rate float64) error {
	o := b.opts
	batch := o.InsertBatch
	var every time.Duration
	if rate > 0 {
		// A batch every 5 ms in total, spread over the producers.
		batch = max(1, min(batch, int(rate*0.005+0.5)))
		every = time.Duration(float64(time.Second) * float64(batch) * float64(o.Producers) / rate)
	}
	payload := json.RawMessage(`{"bench":true}`)
	if o.PayloadBytes > 0 {
		p, err := json.Marshal(map[string]any{"bench": true, "pad": Pad(o.PayloadBytes)})
		if err != nil {
			return err
		}
		payload = p
	}
	var next atomic.Int64 // tasks handed out
	g, ctx := errgroup.WithContext(ctx)
	for p := 0; p < o.Producers; p++ {
		g.Go(func() error {
			nts := make([]task.NewTask, 0, batch)
			ids := make([]uuid.UUID, 0, batch)
			tick := time.Now()
			for {
				first := next.Add(int64(batch)) - int64(batch)
				if first >= int64(o.Tasks) {
					return nil
				}
				n := int(min(int64(batch), int64(o.Tasks)-first))
				if every > 0 {
					if d := time.Until(tick); d > 0 {
						t := time.NewTimer(d)
						select {
						case <-ctx.Done():
							t.Stop()
							return ctx.Err()
						case <-t.C:
						}
					}
					tick = tick.Add(every)
				}
				nts = nts[:0]
				for range n {
					nts = append(nts, task.NewTask{Kind: b.kind, Payload: payload, MaxAttempts: 3})
				}
				res, err := store.CreateBatch(ctx, nts)
				if err != nil {
					return fmt.Errorf("insert %d tasks: %w", n, err)
				}
				now := time.Now()
				ids = ids[:0]
				for _, r := range res {
					ids = append(ids, r.Task.ID)
				}
				b.track.committed(ids, now)
				b.inserted.Add(int64(n))
			}
		})
	}
	return g.Wait()
}

// progress prints a line every opts.Progress until the returned function
// is called.
func (b *run) progress(start time.Time) func() {
	if b.opts.Progress < 0 {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(b.opts.Progress)
		defer t.Stop()
		var lastIns, lastOK int64
		last := start
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				ins, ok := b.inserted.Load(), b.succeeded.Load()
				dt := now.Sub(last).Seconds()
				fmt.Fprintf(b.out, "%6.1fs  inserted %8d (%7.0f/s)  succeeded %8d (%7.0f/s)  in flight %6d  rss %5.0f MiB\n",
					now.Sub(start).Seconds(), ins, float64(ins-lastIns)/dt, ok, float64(ok-lastOK)/dt,
					b.started.Load()-b.failed.Load()-ok, float64(CurrentRSS())/(1<<20))
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

// cleanup deletes the run's tasks (with their audit and outbox rows) and
// streams, unless opts.Keep.
func (b *run) cleanup() {
	if b.opts.Keep {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	_ = b.rdb.Del(ctx, b.stream, b.dlq).Err()
	_, _ = task.DeleteKind(ctx, b.pool, b.kind)
	_, _ = b.pool.Exec(ctx, `DELETE FROM ingest_kind_slot WHERE kind = $1`, b.kind)
	_, _ = b.pool.Exec(ctx, `DELETE FROM ingest_kind WHERE kind = $1`, b.kind)
}

// Print writes the report as a table.
func Print(w io.Writer, r Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	handler := r.Handler
	if handler == "" { // a report from before the field
		handler = r.HandlerSleep
	}
	fmt.Fprintf(tw, "\nRESULT\t%s, %d tasks, handler %s, concurrency %d\n", r.Mode, r.Tasks, handler, r.Concurrency)
	if r.OfferedRate > 0 {
		fmt.Fprintf(tw, "offered load\t%.0f tasks/s\n", r.OfferedRate)
	}
	fmt.Fprintf(tw, "tasks/s worked\t%.0f\t(%d SUCCEEDED in %.2fs)\n", r.TasksPerSecond, r.Succeeded, r.WorkSeconds)
	fmt.Fprintf(tw, "tasks/s inserted\t%.0f\t(%.2fs)\n", r.InsertPerSecond, r.InsertSeconds)
	if r.PayloadBytes > 0 {
		fmt.Fprintf(tw, "payload padding\t%d bytes\n", r.PayloadBytes)
	}
	if r.FailRate > 0 {
		fmt.Fprintf(tw, "fail rate\t%g\t(%d first attempts failed; retry: %s)\n", r.FailRate, r.FailedAttempts, r.RetryDelay)
	}
	if r.SinkRequests > 0 {
		fmt.Fprintf(tw, "webhook sink\t%d requests\t(%d connections)\n", r.SinkRequests, r.SinkConnections)
	}
	fmt.Fprintf(tw, "latency ms\tp50\tp95\tp99\tmax\n")
	p := r.LatencyMS.Start
	fmt.Fprintf(tw, "  commit→handler start\t%.2f\t%.2f\t%.2f\t%.2f\n", p.P50, p.P95, p.P99, p.Max)
	p = r.LatencyMS.Done
	fmt.Fprintf(tw, "  commit→SUCCEEDED\t%.2f\t%.2f\t%.2f\t%.2f\n", p.P50, p.P95, p.P99, p.Max)
	fmt.Fprintf(tw, "SQL statements/task\t%.2f\t(%d, BEGIN/COMMIT included)\n", r.SQLPerTask, r.SQLStatements)
	fmt.Fprintf(tw, "Redis round trips/task\t%.3f\t(%d)\n", r.RedisPerTask, r.RedisRoundTrips)
	fmt.Fprintf(tw, "peak RSS\t%.0f MiB\t(max %d tasks in flight)\n", r.PeakRSSMiB, r.MaxInFlight)
	if m := r.MemoryAtPeak; m.RSSMiB > 0 {
		fmt.Fprintf(tw, "  at the peak\t%.0f MiB\t(Go runtime %.0f MiB: stacks %.1f MiB in %d goroutines, live heap %.1f MiB)\n",
			m.RSSMiB, m.RuntimeMiB, m.StacksMiB, m.Goroutines, m.HeapLiveMiB)
	}
	fmt.Fprintf(tw, "WAL/task\t%.0f bytes\t%.1f records\t(whole run, server-wide)\n", r.WAL.BytesPerTask, r.WAL.RecordsPerTask)
	if w := r.WALWork; w != nil {
		fmt.Fprintf(tw, "  after the inserts\t%.0f bytes\t%.1f records\n", w.BytesPerTask, w.RecordsPerTask)
	}
	if r.RetentionDeleted > 0 {
		fmt.Fprintf(tw, "retention\t%d tasks deleted\n", r.RetentionDeleted)
	}
	if h := r.Hold; h != nil {
		fmt.Fprintf(tw, "held transactions\t%s from %s\t(steady periods)\n", h.Duration, h.After)
		fmt.Fprintf(tw, "  \ttasks/s\tstart p50/p99 ms\trescuer page p50/p99/max ms\tperiods\n")
		for _, p := range []struct {
			name string
			s    PhaseSummary
		}{{"  clean", h.Clean}, {"  held", h.Held}} {
			fmt.Fprintf(tw, "%s\t%.0f\t%.1f / %.1f\t%.1f / %.1f / %.1f\t%d\n", p.name, p.s.TasksPerSecond, p.s.StartMS.P50, p.s.StartMS.P99,
				p.s.RescuePageMS.P50, p.s.RescuePageMS.P99, p.s.RescuePageMS.Max, p.s.Periods)
		}
		fmt.Fprintf(tw, "  held / clean\t%.2f\n", h.ThroughputRatio)
		for _, t := range sortedKeys(h.MaxDeadTuples) {
			fmt.Fprintf(tw, "  most dead tuples\t%s\t%d\n", t, h.MaxDeadTuples[t])
		}
	}
	_ = tw.Flush()
	printCounts(w, "SQL statements", r.StatementCounts, r.Tasks)
	printCounts(w, "Redis round trips", r.RedisCommandCounts, r.Tasks)
}

func printCounts(w io.Writer, title string, m map[string]int64, tasks int) {
	type kv struct {
		k string
		v int64
	}
	var l []kv
	for k, v := range m {
		l = append(l, kv{k, v})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v || (l[i].v == l[j].v && l[i].k < l[j].k) })
	fmt.Fprintf(w, "\n%s by kind (count, per task):\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, e := range l {
		if i == 12 {
			fmt.Fprintf(tw, "\t\t\t%s\n", fmt.Sprintf("… %d more", len(l)-i))
			break
		}
		fmt.Fprintf(tw, "%d\t%.3f\t  \t%s\n", e.v, float64(e.v)/float64(tasks), strings.TrimSpace(e.k))
	}
	_ = tw.Flush()
}
