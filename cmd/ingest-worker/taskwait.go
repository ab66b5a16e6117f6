package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/task"
)

// The result as task show prints it: indented, at most this many lines and
// bytes (--json has all of it).
const (
	resultLines = 40
	resultBytes = 4000
)

// progressText is a progress for a table cell: "40% page 4 of 10 (2s ago)".
func progressText(p *task.Progress) string {
	s := fmt.Sprintf("%d%%", p.Percent)
	if p.Message != "" {
		s += " " + clip(p.Message, 200)
	}
	return s + " (" + relative(p.UpdatedAt) + ")"
}

// printResult prints t's result after the task table: indented JSON, cut
// with a note, every line terminal-safe.
func (a *app) printResult(t task.Task) {
	if e := t.ResultEncrypted; e != nil {
		a.printf("\nRESULT\n%s\n", encryptedText(e))
		return
	}
	if t.Result == nil {
		return
	}
	text, cut := task.ResultPreview(t.Result, resultLines, resultBytes)
	a.printf("\nRESULT\n")
	_, _ = io.WriteString(a.stdout, termsafe.Text(text)+"\n")
	if cut {
		a.printf("… cut: the result is %d bytes; --json shows all of it\n", len(t.Result))
	}
}

// listeningStore is the task store on pool whose LISTEN connections (an
// Awaiter's: GET /v1/tasks/{id}?wait=, task wait) come from where the
// worker's do (INGEST_DATABASE_LISTEN_URL behind a pooler).
func (a *app) listeningStore(ctx context.Context, pool *pgxpool.Pool) (*task.Store, error) {
	cfg := a.storeConfig()
	var err error
	if cfg.Listen, err = a.listenSource(ctx, pool); err != nil {
		return nil, err
	}
	store, err := task.NewStore(cfg, pool)
	if err != nil {
		return nil, usageErr(err)
	}
	return store, nil
}

func (a *app) taskWaitCommand() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait until a task ends; exit 0 when it SUCCEEDED",
		Long: `Wait until a task ends (SUCCEEDED, DEAD or CANCELLED) or --timeout passes,
then print its final state (and its result, or its last error). It is woken by
the notification of the task's end (one LISTEN connection; behind a connection
pooler without INGEST_DATABASE_LISTEN_URL it checks every second).
Exit status: 0 when the task SUCCEEDED; 1 when it ended otherwise, the
timeout passed first, or the database failed; 2 for bad arguments.`,
		Example: `  ingest-worker task wait 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f
  ingest-worker task wait 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f --timeout 30s --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			id, err := parseTaskID(args[0])
			if err != nil {
				return err
			}
			if timeout < 0 {
				return usagef("--timeout must be >= 0 (0: no limit), got %s", timeout)
			}
			ctx := cmd.Context()
			pool, err := a.openDB(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			store, err := a.listeningStore(ctx, pool)
			if err != nil {
				return err
			}
			aw := task.NewAwaiter(store, a.log)
			defer aw.Close()
			wctx, cancel := ctx, context.CancelFunc(func() {})
			if timeout > 0 {
				wctx, cancel = context.WithTimeout(ctx, timeout)
			}
			defer cancel()
			t, err := aw.Wait(wctx, id)
			timedOut := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
			if err != nil && !timedOut {
				return err
			}
			if timedOut {
				// Read the state the task is in now, for the message.
				if t, err = store.Get(ctx, id); err != nil {
					return err
				}
			}
			if a.json {
				if err := a.printJSON(map[string]any{"id": id, "status": t.Status, "timed_out": timedOut,
					"result": t.Result, "last_error": t.LastError}); err != nil {
					return err
				}
			} else {
				a.printf("task %s %s\n", id, t.Status)
				switch {
				case t.Status == task.Succeeded:
					a.printResult(t)
				case t.LastError != "":
					a.printf("last error: %s\n", clip(t.LastError, 200))
				}
			}
			switch {
			case timedOut:
				return fmt.Errorf("task %s is still %s after %s", id, t.Status, timeout)
			case t.Status != task.Succeeded:
				return fmt.Errorf("task %s ended %s", id, t.Status)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long (exit 1); 0: wait until the task ends")
	return cmd
}
