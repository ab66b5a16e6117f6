package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/bench"
	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/migrations"
	"github.com/ingest-worker/ingest/task"
)

const benchLong = `Measure the full production path: tasks are created in PostgreSQL (task,
audit row and outbox row per task, in batches), published by the outbox relay
to a Redis stream, read by the consumer group, started (RUNNING + audit row),
handled by the --handler and completed (SUCCEEDED + audit row, XACK), by the
same components 'run' starts.

Handlers: noop (the default) returns at once, or after --handler-sleep;
webhook is the binary's webhook handler, as 'run' configures it with
INGEST_WEBHOOK_URL (default timeout and HTTP client), POSTing each task to an
HTTP sink the bench starts in the process (127.0.0.1, a free port), which
reads the body and answers 204. The report then counts the sink's requests
and connections.

Modes: --preload inserts all tasks first, then times the worker working them
off; without it, tasks are inserted and worked at the same time, as fast as
possible or at --rate tasks/s. A preload's backlog is outbox rows, which the
relay publishes during the timed work (a backlog that built up while no
relay ran); with --publish-first a relay publishes the tasks as they are
inserted, so the timed work starts from a backlog in the stream (a service
whose workers fell behind its producers while its relays kept up).

--payload-bytes N adds a string of N bytes to each task's payload. With
INGEST_ENCRYPTION_KEYS set, payloads and results are encrypted at rest, as
'run' does: the run measures what encryption costs.
--fail-rate F makes the first attempt of a fraction F of the tasks (chosen
by a hash of the task id) return an error (with --handler webhook: the sink
answers 500, which the webhook handler takes for a failure to retry); they
are retried once, with a short backoff and a fast reclaimer (the report says
which) so that the run measures work, not waiting. The time counts until
every task is SUCCEEDED.

Without INGEST_DATABASE_URL / INGEST_REDIS_URL the bench starts its own
servers: a throwaway PostgreSQL with fsync and synchronous_commit ON (as in
production, so the numbers are honest) and a redis-server on a free port (an
in-process Redis if there is no redis-server). Against configured servers it
uses keys and a task kind unique to the run, deletes its tasks and stream at
the end (unless --keep), and needs a migrated schema.

Progress is printed every 2 s; the result is a table (or --json): tasks/s
worked and inserted, latency percentiles of commit→handler start and
commit→SUCCEEDED, SQL statements and Redis round trips per task (counted on
the clients, BEGIN/COMMIT included) and peak RSS of the process, with
where it went in the largest of samples taken every 200 ms (what the Go
runtime held, the goroutine stacks and their number, the live heap).

--sample D adds a line per period D (and a series in the report, or a CSV
file with --series): tasks/s, commit→handler start p50/p99 of the period, the
p99 of the rescuer's pages (a probe runs the rescuer's candidate query, read
only, every second), dead and live row versions and autovacuum counts of
ingest_task, outbox_row and outbox_log (the tables of the view outbox_event)
and ingest_task_transition, the statements that took the most time.
--hold-transaction D holds, from --hold-after into the run, one session
idle in transaction after taking a transaction id and one REPEATABLE READ
reader open for D, and the result compares the periods with and without
them (tasks/s, latency, rescuer pages, dead tuples).
--soak (a long run, not for CI) also samples table and index sizes and times
the dashboard's overview and task list, the API's task list and a /metrics
scrape; with --retention D, retention deletes SUCCEEDED tasks D after they
finished, as a production worker does (every task of the database past D:
use a database of its own).`

func (a *app) benchCommand() *cobra.Command {
	var opts bench.Options
	var cpuProfile, memProfile, seriesFile string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput and latency of the full path (PostgreSQL, outbox, Redis, worker)",
		Long:  benchLong,
		Example: `  ingest-worker bench --preload --tasks 200000
  ingest-worker bench --preload --publish-first --tasks 200000
  ingest-worker bench --tasks 200000
  ingest-worker bench --tasks 60000 --rate 2000
  ingest-worker bench --tasks 2000 --json
  ingest-worker bench --preload --tasks 200000 --payload-bytes 1024 --fail-rate 0.05
  ingest-worker bench --preload --tasks 20000 --handler webhook
  ingest-worker bench --tasks 420000 --rate 1000 --hold-transaction 5m --hold-after 1m --series hold.csv
  ingest-worker bench --soak --tasks 10000000 --rate 1000 --retention 10m --series soak.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, map[string]string{"INGEST_LOG_LEVEL": "warn"}); err != nil {
				return err
			}
			if err := opts.Validate(); err != nil {
				return usageErr(err)
			}
			a.limitMemory()
			stopTracing, err := a.startTracing(cmd.Context())
			if err != nil {
				return err
			}
			defer stopTracing()
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return usagef("--cpu-profile: %v", err)
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return fmt.Errorf("--cpu-profile: %w", err)
				}
				defer pprof.StopCPUProfile()
			}
			if memProfile != "" {
				f, err := os.Create(memProfile)
				if err != nil {
					return usagef("--mem-profile: %v", err)
				}
				defer f.Close()
				// Written when the run ends: every allocation since the
				// process began (go tool pprof -sample_index=alloc_space).
				defer func() {
					if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "--mem-profile: %v\n", err)
					}
				}()
			}
			if seriesFile != "" {
				f, err := os.Create(seriesFile)
				if err != nil {
					return usagef("--series: %v", err)
				}
				defer f.Close()
				opts.SeriesOut = f
			}
			return a.bench(cmd, opts)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Tasks, "tasks", bench.DefaultTasks, "tasks to create and work")
	f.BoolVar(&opts.Preload, "preload", false, "insert all tasks first, then work them (default: insert and work at once)")
	f.BoolVar(&opts.PublishFirst, "publish-first", false, "with --preload: publish the tasks to the stream while inserting them, so the timed work starts from a backlog in Redis (default: from outbox rows, which the relay publishes during the timed work)")
	f.Float64Var(&opts.Rate, "rate", 0, "continuous mode: offered load in tasks/s (0: as fast as possible)")
	f.StringVar(&opts.Handler, "handler", bench.HandlerNoop, "the tasks' handler: "+strings.Join(bench.Handlers, " or ")+" (the binary's webhook handler POSTing to an in-process HTTP sink)")
	f.DurationVar(&opts.HandlerSleep, "handler-sleep", 0, "the noop handler's fixed work time (0: none)")
	f.IntVar(&opts.PayloadBytes, "payload-bytes", 0, "length of a string carried in each task's payload (0: none)")
	f.Float64Var(&opts.FailRate, "fail-rate", 0, "fraction of tasks whose first attempt fails, chosen from the task id; they are retried once, soon")
	f.IntVar(&opts.Concurrency, "concurrency", bench.DefaultConcurrency, "handler slots of the worker")
	f.IntVar(&opts.KindConcurrency, "kind-concurrency", 0, "limit the run's kind to this many running tasks across workers (0: no limit), to measure the limiter")
	f.Var((*rateFlag)(&opts.KindRate), "kind-rate", "limit the run's kind to this start rate, e.g. 50000/s (0: no limit), to measure the limiter")
	f.IntVar(&opts.ReadCount, "read-count", bench.DefaultReadCount, "most entries per stream read (all started in one statement)")
	f.IntVar(&opts.CompleteBatch, "complete-batch", bench.DefaultCompleteBatch, "most outcomes per completion statement")
	f.DurationVar(&opts.CompleteWindow, "complete-window", bench.DefaultCompleteWindow, "longest wait gathering outcomes")
	f.IntVar(&opts.RelayBatch, "relay-batch", bench.DefaultRelayBatch, "outbox rows per relay pass")
	f.IntVar(&opts.InsertBatch, "insert-batch", bench.DefaultInsertBatch, "tasks per insert transaction")
	f.IntVar(&opts.Producers, "producers", bench.DefaultProducers, "concurrent inserters")
	f.IntVar(&opts.PoolConns, "pool-conns", bench.DefaultPoolConns, "PostgreSQL connections of the path")
	f.DurationVar(&opts.Timeout, "timeout", bench.DefaultTimeout, "give up after this long")
	f.BoolVar(&opts.Keep, "keep", false, "keep the run's tasks and stream (configured servers)")
	f.DurationVar(&opts.Hold, "hold-transaction", 0, "hold a transaction idle in transaction (with a transaction id) and a REPEATABLE READ reader open for this long, to measure the path while vacuum is held back (0: none)")
	f.DurationVar(&opts.HoldAfter, "hold-after", 0, "with --hold-transaction: open the transactions this long into the run")
	f.DurationVar(&opts.Sample, "sample", 0, "print and report a sample of the run every period: throughput, latency, the rescuer's page time, dead tuples, slowest statements (default 10s with --hold-transaction, 30s with --soak; 0: none)")
	f.StringVar(&seriesFile, "series", "", "write the samples to this file as CSV, a row per period as it ends")
	f.DurationVar(&opts.Retention, "retention", 0, "run retention with SUCCEEDED tasks deleted this long after they finished (0: the default windows; deletes every task of the database past the window)")
	f.BoolVar(&opts.Soak, "soak", false, "also sample table and index sizes and time the dashboard's overview and list, the API's list and a /metrics scrape (a long run: not for CI)")
	f.StringVar(&cpuProfile, "cpu-profile", "", "write the process's CPU profile of the whole run to this file (for go tool pprof)")
	f.StringVar(&memProfile, "mem-profile", "", "write the process's allocation profile of the whole run to this file when it ends (for go tool pprof)")
	return cmd
}

func (a *app) bench(cmd *cobra.Command, opts bench.Options) error {
	ctx := cmd.Context()
	out := a.progressOut()
	opts.Keyring = a.cfg.Keyring // INGEST_ENCRYPTION_KEYS: the cost of encryption at rest
	ownPG, ownRedis := !a.setByUser("INGEST_DATABASE_URL"), !a.setByUser("INGEST_REDIS_URL")
	srv, err := bench.StartServers(ctx, ownPG, ownRedis)
	if errors.Is(err, pgtemp.ErrNoBinaries) {
		return usagef("the bench needs PostgreSQL: install the server binaries or set INGEST_DATABASE_URL (%v)", err)
	}
	if err != nil {
		return err
	}
	defer srv.Close()
	if ownPG {
		a.cfg.DatabaseURL = srv.DatabaseURL
		fmt.Fprintf(out, "PostgreSQL: %s\n", srv.Postgres)
	} else {
		fmt.Fprintf(out, "PostgreSQL: %s\n", a.dbShown())
	}
	if ownRedis {
		a.cfg.RedisURL, a.cfg.RedisCluster = srv.RedisURL, false
		fmt.Fprintf(out, "Redis:      %s\n", srv.Redis)
	}
	pool, err := a.openDB(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if ownPG {
		if _, err := migrations.Up(ctx, pool); err != nil {
			return err
		}
	} else if err := migrations.Check(ctx, pool); err != nil {
		return fmt.Errorf("schema check: %w", err)
	}
	rdb, err := a.openRedis(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()

	if opts.Listen, err = a.listenSource(ctx, pool); err != nil {
		return err
	}
	opts.Logger = a.log
	opts.Progress = 2 * time.Second
	rep, err := bench.Run(ctx, opts, pool, rdb, out)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(rep)
	}
	bench.Print(a.stdout, rep)
	return nil
}

// rateFlag is a task.Rate as a command-line flag ("5/s", "300/m").
type rateFlag task.Rate

func (r *rateFlag) String() string { return task.Rate(*r).String() }
func (r *rateFlag) Type() string   { return "rate" }
func (r *rateFlag) Set(s string) error {
	v, err := task.ParseRate(s)
	if err != nil {
		return errors.New(fieldMsg(err))
	}
	*r = rateFlag(v)
	return nil
}
