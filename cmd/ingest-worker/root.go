package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/internal/memlimit"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/stream"
)

// limitMemory gives a long-running command (run, bench) the default soft
// memory limit (package memlimit), unless GOMEMLIMIT or GOGC=off is set,
// when execute runs as the process's command: a test's process keeps its
// runtime settings.
func (a *app) limitMemory() {
	if !ownsProcess {
		return
	}
	if _, started := memlimit.Start(os.Getenv, memlimit.DefaultFloor); started {
		a.log.Debug("soft memory limit set", "floor_bytes", memlimit.DefaultFloor)
	}
}

// ownsProcess is true when execute runs as the process's command (main),
// not inside a test: go-redis has one logger per process, which only the
// process's command may set.
var ownsProcess bool

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1 // the command failed at run time
	exitUsage   = 2 // bad arguments, flags or configuration
)

// exitError carries the exit code of a failed command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErr marks err as a usage or configuration error (exit code 2).
func usageErr(err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: exitUsage, err: err}
}

// usagef is usageErr(fmt.Errorf(...)).
func usagef(format string, args ...any) error { return usageErr(fmt.Errorf(format, args...)) }

// app is one invocation of the binary: its streams, environment and the
// configuration its command loaded.
type app struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	lookup func(string) (string, bool)

	json  bool
	cfg   *Config
	all   []resolved
	scrub *redact.Scrubber
	log   *slog.Logger
	// dbPooled: openDB found INGEST_DATABASE_URL behind a connection
	// pooler (session.go).
	dbPooled bool
}

// execute runs the command line args and returns the exit code.
func execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, lookup func(string) (string, bool)) int {
	a := &app{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, lookup: lookup, scrub: redact.NewScrubber()}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	code := exitUsage // errors cobra returns itself: unknown command, bad flags
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	// Each line of the message shown safe for a terminal: an error can
	// quote a kind or an error text from the database.
	lines := strings.Split(a.scrub.String(err.Error()), "\n")
	for i, l := range lines {
		lines[i] = termsafe.String(l)
	}
	fmt.Fprintf(stderr, "ingest-worker: %s\n", strings.Join(lines, "\n  "))
	if code == exitUsage && cmd != nil {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

const rootLong = `ingest-worker runs ingest tasks reliably. PostgreSQL holds the truth about
every task (its state, attempts and an audit trail of every change); a Redis
Stream consumer group carries tasks to a pool of workers. Nothing is lost
when a worker, Redis or PostgreSQL restarts.

New here? Start with the demo. It needs no setup (only PostgreSQL's server
binaries, or INGEST_DATABASE_URL pointing at a database):

  ingest-worker demo

Then, against your own PostgreSQL and Redis:

  export INGEST_DATABASE_URL=postgres://user:pass@localhost:5432/ingest
  export INGEST_REDIS_URL=redis://localhost:6379/0
  ingest-worker migrate                                  # create the schema
  INGEST_WEBHOOK_URL=http://localhost:9000/hook ingest-worker run
  ingest-worker enqueue --kind email --payload '{"to":"a@example.com"}'
  ingest-worker task list

Every setting is an environment variable and a flag of the same meaning
(INGEST_REDIS_URL and --redis-url); a flag wins over the variable. See
'ingest-worker config' for all of them and their current values.

Output is a table for people; add --json for scripts. Exit codes: 0 ok,
1 the command failed, 2 bad usage or configuration.`

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "ingest-worker",
		Short:         "Run ingest tasks reliably with PostgreSQL and Redis Streams",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
		// No Run: "ingest-worker" alone prints the help.
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	root.PersistentFlags().BoolVar(&a.json, "json", false, "print JSON instead of tables (for scripts)")
	addFlags(root.PersistentFlags(), scopeGlobal)

	root.AddGroup(
		&cobra.Group{ID: "start", Title: "Getting started:"},
		&cobra.Group{ID: "run", Title: "Running:"},
		&cobra.Group{ID: "inspect", Title: "Tasks and inspection:"},
	)
	add := func(group string, cmds ...*cobra.Command) {
		for _, c := range cmds {
			c.GroupID = group
			root.AddCommand(c)
		}
	}
	add("start", a.demoCommand(), a.configCommand())
	add("run", a.runCommand(), a.uiCommand(), a.migrateCommand(), a.keysCommand(), a.healthcheckCommand(), a.benchCommand())
	add("inspect", a.enqueueCommand(), a.taskCommand(), a.dlqCommand(), a.pendingCommand(), a.periodicCommand(), a.kindCommand())
	wrapRunE(root)
	return root
}

// wrapRunE makes every command's own errors runtime errors (exit 1) unless
// they are marked otherwise, and validates positional arguments as usage
// errors (exit 2).
func wrapRunE(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := run(cmd, args)
			var ee *exitError
			if err != nil && !errors.As(err, &ee) {
				err = &exitError{code: exitRuntime, err: err}
			}
			return err
		}
	}
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error { return usageErr(args(cmd, a)) }
	}
	for _, sub := range c.Commands() {
		wrapRunE(sub)
	}
}

// load resolves the configuration for cmd (with overrides of defaults) and
// sets up the logger. A bad setting is a usage error.
func (a *app) load(cmd *cobra.Command, overrides map[string]string) error {
	cfg, all, err := loadConfig(cmd, a.lookup, overrides)
	a.all = all
	a.scrub = newScrubberFor(all)
	if err != nil {
		return usageErr(fmt.Errorf("invalid configuration:\n%w", err))
	}
	a.cfg = cfg
	for _, r := range all {
		if r.ignored != nil {
			a.notef("warning: ignoring %s (--%s): %v; this command does not use it (the default applies)\n", r.env, r.flagName(), a.scrub.String(r.ignored.Error()))
		}
	}
	a.log = newLogger(a.stderr, cfg.LogLevel, cfg.LogFormat, a.scrub)
	if ownsProcess {
		// go-redis logs through the process's logger (its format, its
		// scrubbing), not in a format of its own on stderr.
		redis.SetLogger(stream.RedisLogger{Logger: a.log})
	}
	return nil
}

// newLogger returns a logger writing to w that scrubs secrets from every
// message and attribute.
func newLogger(w io.Writer, level slog.Level, format string, scrub *redact.Scrubber) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: func(_ []string, at slog.Attr) slog.Attr {
		switch v := at.Value.Any().(type) {
		case string:
			return slog.String(at.Key, scrub.String(v))
		case error:
			return slog.String(at.Key, scrub.String(v.Error()))
		case fmt.Stringer:
			if at.Value.Kind() == slog.KindAny {
				return slog.String(at.Key, scrub.String(v.String()))
			}
		}
		return at
	}}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
