package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/migrations"
	"github.com/ingest-worker/ingest/task"
)

const demoLong = `Watch ingest-worker work, with zero setup.

The demo starts an in-process Redis (served on a TCP port, so redis-cli can
connect) and a throwaway PostgreSQL from the local server binaries (as the
user nobody when run as root), unless INGEST_REDIS_URL / INGEST_DATABASE_URL
point at real ones. It runs a full worker (consumers, reclaimer, outbox relay,
HTTP API) with quick retry timings, enqueues a scripted mix of tasks in one
transaction, shows live progress, and ends with a summary by status, the DLQ
contents and the exact redis-cli and psql commands to look at what happened.

The script:
  demo.ok         succeed after a short piece of work
  demo.flaky      fail once or twice, then succeed (the retries are in the audit trail)
  demo.broken     always fail: DEAD after 3 attempts, then in the DLQ
  demo.permanent  fail with a permanent error: DEAD at once, no retry

With --keep the servers and the worker keep running after the summary, so you
can run the printed commands, enqueue more demo.* tasks, or use the HTTP API;
stop with Ctrl-C. Point it at real servers only with keys no other worker
consumes (the demo's handlers are the only ones that know the demo.* kinds).`

// demoDefaults are the demo's timings: quick retries so the script ends in
// seconds. Variables and flags still override them.
var demoDefaults = map[string]string{
	"INGEST_REDIS_RETRY_BASE_BACKOFF_MS": "200",
	"INGEST_REDIS_RETRY_MAX_BACKOFF_MS":  "1000",
	"INGEST_REDIS_RECLAIM_INTERVAL_MS":   "200",
	"INGEST_REDIS_RECLAIM_IDLE_MS":       "5000",
	"INGEST_TASK_LEASE_MS":               "3000",
	"INGEST_TASK_TIMEOUT_MS":             "10000",
	"INGEST_SHUTDOWN_TIMEOUT_MS":         "5000",
	"INGEST_OUTBOX_PUBLISH_INTERVAL_MS":  "200",
	"INGEST_KAFKA_RETRY_BASE_BACKOFF_MS": "200",
	"INGEST_KAFKA_RETRY_MAX_BACKOFF_MS":  "1000",
	"INGEST_KAFKA_PUBLISH_INTERVAL_MS":   "200",
	"INGEST_HTTP_ADDR":                   "127.0.0.1:0",
	"INGEST_LOG_LEVEL":                   "error",
}

// demoKinds is the script, in the order shown.
var demoKinds = []string{"demo.ok", "demo.flaky", "demo.broken", "demo.permanent"}

// demoSummary is the JSON output of demo.
type demoSummary struct {
	Tasks    int                       `json:"tasks"`
	ByStatus map[string]int            `json:"by_status"`
	ByKind   map[string]map[string]int `json:"by_kind"`
	// FailedAttempts is the number of failed runs over all tasks.
	FailedAttempts int         `json:"failed_attempts"`
	DLQ            []dlq.Entry `json:"dlq"`
	ElapsedMS      int64       `json:"elapsed_ms"`
	RedisURL       string      `json:"redis_url"`
	DatabaseURL    string      `json:"database_url"`
	HTTPAddr       string      `json:"http_addr,omitempty"`
	Commands       []string    `json:"commands"`
	TaskIDs        []uuid.UUID `json:"task_ids"`
}

func (a *app) demoCommand() *cobra.Command {
	var keep bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "See it work with zero setup: throwaway Redis and PostgreSQL, scripted tasks, a summary",
		Long:  demoLong,
		Example: `  ingest-worker demo
  ingest-worker demo --keep
  INGEST_DATABASE_URL=postgres://localhost/scratch ingest-worker demo --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, demoDefaults); err != nil {
				return err
			}
			if timeout <= 0 {
				return usagef("--timeout must be > 0, got %s", timeout)
			}
			stopTracing, err := a.startTracing(cmd.Context())
			if err != nil {
				return err
			}
			defer stopTracing()
			return a.demo(cmd.Context(), keep, timeout)
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the servers and the worker running after the summary (Ctrl-C stops)")
	cmd.Flags().DurationVar(&timeout, "timeout", 50*time.Second, "give up when the script has not finished by then")
	addFlags(cmd.Flags(), scopeWorker)
	return cmd
}

// setByUser reports whether a setting came from a flag or the environment.
func (a *app) setByUser(env string) bool {
	for _, r := range a.all {
		if r.env == env {
			return r.from != fromDefault
		}
	}
	return false
}

// progressOut is where progress lines go: stdout for people, stderr when
// stdout is JSON.
func (a *app) progressOut() io.Writer {
	if a.json {
		return a.stderr
	}
	return a.stdout
}

func (a *app) demo(ctx context.Context, keep bool, timeout time.Duration) error {
	start := time.Now()
	out := a.progressOut()
	say := func(format string, args ...any) { fmt.Fprintf(out, format, shown(args)...) }

	// The queue: Kafka (in-process kfake unless configured), or Redis
	// (in-process unless configured).
	mode := a.mode()
	queueCLI, stopQueue, err := mode.demoServers(say)
	if err != nil {
		return err
	}
	defer stopQueue()

	// PostgreSQL: throwaway unless configured.
	if !a.setByUser("INGEST_DATABASE_URL") {
		say("PostgreSQL: starting a throwaway cluster (initdb, pg_ctl)")
		if os.Geteuid() == 0 {
			say(" as user nobody")
		}
		say("...\n")
		srv, err := pgtemp.Start()
		if errors.Is(err, pgtemp.ErrNoBinaries) {
			return usagef("the demo needs PostgreSQL, and there is no server binary here.\n"+
				"Either install the server binaries (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; macOS: brew install postgresql),\n"+
				"or point the demo at a database it may use: INGEST_DATABASE_URL=postgres://user:pass@host:5432/dbname ingest-worker demo\n"+
				"(%v)", err)
		}
		if err != nil {
			return fmt.Errorf("start a throwaway PostgreSQL: %w", err)
		}
		if !keep {
			defer srv.Close()
		} else {
			defer func() {
				say("stopping PostgreSQL...\n")
				_ = srv.Close()
			}()
		}
		if err := createDatabase(ctx, srv.URL("postgres"), "ingest_demo"); err != nil {
			return err
		}
		a.cfg.DatabaseURL = srv.URL("ingest_demo")
		say("PostgreSQL: %s (data in %s)\n", a.cfg.DatabaseURL, srv.Dir)
	} else {
		say("PostgreSQL: %s\n", a.dbShown())
	}

	pool, rdb, closeAll, err := mode.openServers(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	mpool, closeMigrationDB, err := a.openMigrationDB(ctx, pool) // a direct connection behind a pooler
	if err != nil {
		return err
	}
	applied, err := migrations.Up(ctx, mpool)
	closeMigrationDB()
	if err != nil {
		return err
	} else if len(applied) > 0 {
		say("schema:     applied migration(s) %s\n", joinInts(applied))
	}

	st, err := a.newStack(ctx, pool, rdb)
	if err != nil {
		return err
	}
	registerDemoHandlers(st.svc)
	ln, err := st.listen()
	if err != nil {
		return err
	}
	httpAddr := ""
	if ln != nil {
		httpAddr = ln.Addr().String()
		say("dashboard:  %s (while the demo runs; --keep keeps it)\n", dashboardURL(httpAddr))
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan error, 1)
	go func() { runDone <- st.run(runCtx, ln) }()
	stopWorker := func() error {
		stopRun()
		return <-runDone
	}

	ids, err := enqueueDemo(ctx, st.store)
	if err != nil {
		_ = stopWorker()
		return err
	}
	say("enqueued:   %d tasks in one transaction (%s)\n\n", len(ids), strings.Join(demoKinds, ", "))

	finished, err := a.demoProgress(ctx, pool, ids, timeout, runDone)
	if err != nil {
		_ = stopWorker()
		return err
	}

	sum, err := a.demoSummary(ctx, pool, rdb, ids)
	if err != nil {
		_ = stopWorker()
		return err
	}
	sum.ElapsedMS = time.Since(start).Milliseconds()
	sum.RedisURL, sum.DatabaseURL, sum.HTTPAddr = redact.DSN(a.cfg.RedisURL), redact.DSN(a.cfg.DatabaseURL), httpAddr
	sum.Commands = a.demoCommands(queueCLI, httpAddr, ids, sum)
	if a.json {
		if err := a.printJSON(sum); err != nil {
			return err
		}
	} else {
		a.printDemoSummary(sum, keep)
	}
	if !finished {
		_ = stopWorker()
		if ctx.Err() != nil {
			return nil // interrupted: the summary shows where it was
		}
		return fmt.Errorf("the script did not finish within %s (see the summary above)", timeout)
	}
	if keep {
		say("\nThe servers and the worker keep running; press Ctrl-C to stop.\n")
		select {
		case <-ctx.Done():
		case err := <-runDone:
			return err
		}
	}
	return stopWorker()
}

// createDatabase creates database name on the server of adminURL.
func createDatabase(ctx context.Context, adminURL, name string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to the throwaway PostgreSQL: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// demoPayload is the payload of a scripted task.
type demoPayload struct {
	N int `json:"n"`
	// FailTimes is how many runs of a demo.flaky task fail before it
	// succeeds.
	FailTimes int    `json:"fail_times,omitempty"`
	Note      string `json:"note"`
}

func registerDemoHandlers(w *ingest.Service) {
	work := func(ctx context.Context) error {
		select {
		case <-time.After(time.Duration(20+rand.IntN(180)) * time.Millisecond): // simulated work
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.Handle("demo.ok", func(ctx context.Context, t ingest.Task) error { return work(ctx) })
	w.Handle("demo.flaky", func(ctx context.Context, t ingest.Task) error {
		if err := work(ctx); err != nil {
			return err
		}
		var p demoPayload
		_ = json.Unmarshal(t.Payload, &p)
		if t.Attempt <= p.FailTimes {
			return fmt.Errorf("flaky: simulated upstream timeout on attempt %d of %d", t.Attempt, t.MaxAttempts)
		}
		return nil
	})
	w.Handle("demo.broken", func(ctx context.Context, t ingest.Task) error {
		if err := work(ctx); err != nil {
			return err
		}
		return fmt.Errorf("broken: upstream answered 503 Service Unavailable (attempt %d of %d)", t.Attempt, t.MaxAttempts)
	})
	w.Handle("demo.permanent", func(ctx context.Context, t ingest.Task) error {
		return ingest.Permanent(errors.New("the recipient address does not exist; retrying cannot help"))
	})
}

// The script's size.
const (
	demoOK     = 30
	demoFlaky  = 8
	demoBroken = 3
)

func enqueueDemo(ctx context.Context, store *task.Store) ([]uuid.UUID, error) {
	var nts []task.NewTask
	add := func(kind string, p demoPayload, maxAttempts int) {
		b, _ := json.Marshal(p)
		nts = append(nts, task.NewTask{Kind: kind, Payload: b, MaxAttempts: maxAttempts})
	}
	for i := range demoOK {
		add("demo.ok", demoPayload{N: i, Note: "succeeds"}, 0)
	}
	for i := range demoFlaky {
		add("demo.flaky", demoPayload{N: i, FailTimes: 1 + i%2, Note: "fails, then succeeds"}, 5)
	}
	for i := range demoBroken {
		add("demo.broken", demoPayload{N: i, Note: "always fails"}, 3)
	}
	add("demo.permanent", demoPayload{N: 0, Note: "fails permanently"}, 0)
	rand.Shuffle(len(nts), func(i, j int) { nts[i], nts[j] = nts[j], nts[i] })
	res, err := store.CreateBatch(ctx, nts)
	if err != nil {
		return nil, fmt.Errorf("enqueue the demo tasks: %w", err)
	}
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	return ids, nil
}

// countByStatus counts the tasks of ids per status.
func countByStatus(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID) (map[string]int, error) {
	store, err := task.NewStore(task.Config{}, pool)
	if err != nil {
		return nil, err
	}
	counts, err := store.CountByStatus(ctx, ids...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(counts))
	for s, n := range counts {
		out[string(s)] = int(n)
	}
	return out, nil
}

// demoProgress shows progress until every task is terminal (true),
// the timeout passes or ctx is cancelled (false).
func (a *app) demoProgress(ctx context.Context, pool *pgxpool.Pool, ids []uuid.UUID, timeout time.Duration, runDone <-chan error) (bool, error) {
	out := a.progressOut()
	tty := isTerminal(out)
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	last := ""
	start := time.Now()
	for {
		counts, err := countByStatus(ctx, pool, ids)
		if err != nil && ctx.Err() == nil {
			return false, err
		}
		line := fmt.Sprintf("%5.1fs  queued %-3d running %-3d retrying %-3d succeeded %-3d dead %-3d cancelled %-3d",
			time.Since(start).Seconds(), counts["QUEUED"], counts["RUNNING"], counts["RETRYING"], counts["SUCCEEDED"], counts["DEAD"], counts["CANCELLED"])
		finished := 0
		for s, n := range counts {
			if task.State(s).Terminal() {
				finished += n
			}
		}
		done := finished == len(ids)
		state := line[7:]
		switch {
		case tty:
			fmt.Fprintf(out, "\r%s", line)
		case state != last || done:
			fmt.Fprintln(out, line)
		}
		last = state
		if done {
			if tty {
				fmt.Fprintln(out)
			}
			return true, nil
		}
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(out)
			}
			return false, nil
		case err := <-runDone:
			if tty {
				fmt.Fprintln(out)
			}
			if err == nil {
				err = errors.New("the worker stopped")
			}
			return false, err
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			if tty {
				fmt.Fprintln(out)
			}
			return false, nil
		}
	}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (a *app) demoSummary(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient, ids []uuid.UUID) (*demoSummary, error) {
	sum := &demoSummary{Tasks: len(ids), ByKind: map[string]map[string]int{}, DLQ: []dlq.Entry{}, TaskIDs: ids}
	var err error
	if sum.ByStatus, err = countByStatus(ctx, pool, ids); err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT kind, status, count(*), sum(attempt_count) FROM ingest_task WHERE id = ANY($1) GROUP BY kind, status`, ids)
	if err != nil {
		return nil, fmt.Errorf("count tasks by kind: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind, status string
		var n, failed int
		if err := rows.Scan(&kind, &status, &n, &failed); err != nil {
			return nil, err
		}
		if sum.ByKind[kind] == nil {
			sum.ByKind[kind] = map[string]int{}
		}
		sum.ByKind[kind][status] = n
		sum.FailedAttempts += failed
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if sum.DLQ, err = a.mode().demoDLQ(ctx, rdb, ids); err != nil {
		return nil, err
	}
	return sum, nil
}

// demoCommands are the commands to look at what the demo did.
func (a *app) demoCommands(queueCLI, httpAddr string, ids []uuid.UUID, sum *demoSummary) []string {
	psql := "psql '" + redact.DSN(a.cfg.DatabaseURL) + "'"
	if a.cfg.DatabaseURL == "" {
		psql = "psql"
	}
	example := ids[0].String()
	if len(sum.DLQ) > 0 {
		example = sum.DLQ[0].TaskID
	}
	mode := a.mode()
	cmds := mode.demoCommands(queueCLI, sum)
	cmds = append(cmds,
		psql+` -c "SELECT kind, status, count(*), sum(attempt_count) AS failed_attempts FROM ingest_task WHERE kind LIKE 'demo.%' GROUP BY 1, 2 ORDER BY 1, 2"`,
		psql+` -c "SELECT id,status,attempt_count,next_retry_at,last_error,updated_at FROM ingest_task WHERE id='`+example+`'"`,
		psql+` -c "SELECT * FROM ingest_task_transition WHERE task_id='`+example+`' ORDER BY id"`,
		psql+` -c "SELECT id,status,attempt_count,next_retry_at,last_error,created_at,sent_at FROM outbox_event ORDER BY created_at DESC LIMIT 20"`,
	)
	env := mode.demoEnv()
	cmds = append(cmds,
		env+" ingest-worker task show "+example,
		env+" ingest-worker pending",
	)
	if httpAddr != "" {
		cmds = append(cmds, fmt.Sprintf("curl -s 'http://%s/v1/tasks?status=DEAD'", httpAddr),
			"open "+dashboardURL(httpAddr)+"   # the dashboard")
	}
	return cmds
}

// dashboardURL is the address of the dashboard served on addr.
func dashboardURL(addr string) string { return "http://" + addr + "/ui/" }

func (a *app) printDemoSummary(sum *demoSummary, keep bool) {
	a.printf("\nSUMMARY: %d tasks in %.1fs, %d failed attempts along the way\n\n", sum.Tasks, float64(sum.ElapsedMS)/1000, sum.FailedAttempts)
	rows := make([][]string, 0, len(task.States))
	for _, s := range task.States {
		rows = append(rows, []string{string(s), fmt.Sprint(sum.ByStatus[string(s)])})
	}
	a.table([]string{"STATUS", "TASKS"}, rows)

	a.printf("\n")
	kinds := make([]string, 0, len(sum.ByKind))
	for k := range sum.ByKind {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return kindOrder(kinds[i]) < kindOrder(kinds[j]) })
	rows = rows[:0]
	for _, k := range kinds {
		total := 0
		for _, n := range sum.ByKind[k] {
			total += n
		}
		ok, dead, cancelled := sum.ByKind[k]["SUCCEEDED"], sum.ByKind[k]["DEAD"], sum.ByKind[k]["CANCELLED"]
		rows = append(rows, []string{k, fmt.Sprint(total), fmt.Sprint(ok), fmt.Sprint(dead), fmt.Sprint(cancelled), fmt.Sprint(total - ok - dead - cancelled)})
	}
	a.table([]string{"KIND", "TASKS", "SUCCEEDED", "DEAD", "CANCELLED", "NOT FINISHED"}, rows)

	a.printf("\nDLQ (%s): %d entries\n", a.mode().dlqName(), len(sum.DLQ))
	if len(sum.DLQ) > 0 {
		a.printDLQ(sum.DLQ)
	}

	a.printf("\nLOOK AT WHAT HAPPENED\n")
	if !keep && (!a.setByUser("INGEST_REDIS_URL") || !a.setByUser("INGEST_DATABASE_URL")) {
		a.printf("(the throwaway servers stop when the demo exits: run 'ingest-worker demo --keep' to use these commands on them)\n")
	}
	for _, c := range sum.Commands {
		a.printf("  %s\n", c)
	}
}

func kindOrder(k string) int {
	for i, d := range demoKinds {
		if d == k {
			return i
		}
	}
	return len(demoKinds)
}
