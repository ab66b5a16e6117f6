package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/task"
)

// parseTaskIDs parses the task id arguments; a bad one is a usage error
// naming the argument.
func parseTaskIDs(args []string) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, len(args))
	for i, arg := range args {
		id, err := uuid.Parse(arg)
		if err != nil {
			return nil, usagef("argument %d: %q is not a task id (a UUID)", i+1, arg)
		}
		ids[i] = id
	}
	return ids, nil
}

// openWithRedis connects to PostgreSQL, and in Redis mode to Redis too,
// whose entries of deleted or redriven tasks are removed (the task
// stream's and the DLQ's); rdb is nil in Kafka mode, and key, the DLQ
// stream, is "" there and when there is no DLQ.
func (a *app) openWithRedis(ctx context.Context) (store *task.Store, pool *pgxpool.Pool, rdb redis.UniversalClient, key string, closeAll func(), err error) {
	m := a.mode()
	pool, rdb, closeAll, err = m.openServers(ctx)
	if err != nil {
		return nil, nil, nil, "", nil, err
	}
	if store, err = task.NewStore(m.storeConfig(), pool); err != nil {
		closeAll()
		return nil, nil, nil, "", nil, usageErr(err)
	}
	return store, pool, rdb, m.dlqStream(), closeAll, nil
}

// idOutcome is one line of the output of task delete and task redrive.
type idOutcome struct {
	ID uuid.UUID `json:"id"`
	// Outcome: deleted, kept (live), not found (delete); redriven,
	// refused, not found (redrive).
	Outcome string     `json:"outcome"`
	Status  task.State `json:"status,omitempty"`
}

// printOutcomes prints the line of each task id: with --json an object
// {"results": [...], "dlq_removed": n}, else a table and the note
// "<verb> <done>, DLQ entries removed <n>".
func (a *app) printOutcomes(out []idOutcome, verb string, done, removed int) error {
	if a.json {
		return a.printJSON(map[string]any{"results": out, "dlq_removed": removed})
	}
	rows := make([][]string, len(out))
	for i, o := range out {
		rows[i] = []string{o.ID.String(), o.Outcome, string(o.Status)}
	}
	a.table([]string{"TASK", "OUTCOME", "STATUS"}, rows)
	a.notef("%s %d, DLQ entries removed %d\n", verb, done, removed)
	return nil
}

func (a *app) taskDeleteCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "delete ID...",
		Short: "Delete SUCCEEDED, DEAD or CANCELLED tasks with their history",
		Long: `Delete finished tasks (SUCCEEDED, DEAD or CANCELLED), each with its audit
rows, its outbox rows and its DLQ entries, for good. A live task (QUEUED,
RETRYING or RUNNING) is kept: cancel it first. Each deletion is logged with
this invocation (cli:<host>-<pid>). Prints a line per id; the exit status is
1 when an id was kept or not found.`,
		Example: `  ingest-worker task delete 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f
  ingest-worker task delete --json 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f 0190f1c2-8a00-7c1e-9d7e-5a1b2c3d4e60`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			ids, err := parseTaskIDs(args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			store, _, rdb, key, closeAll, err := a.openWithRedis(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			res, removed, rerr := dlq.Delete(ctx, rdb, key, store, ids...)
			if rerr != nil && !errors.As(rerr, new(*dlq.RemoveError)) {
				return rerr
			}
			byID := make(map[uuid.UUID]task.DeleteResult, len(res))
			var deleted []uuid.UUID
			for _, r := range res {
				byID[r.ID] = r
				if r.Deleted {
					deleted = append(deleted, r.ID)
					a.log.Info("task deleted", "task_id", r.ID, "status", r.Status, "actor", a.actor())
				}
			}
			if rerr != nil {
				rerr = fmt.Errorf("%w (dlq discard --task removes a DLQ entry left over)", rerr)
			}
			out := make([]idOutcome, 0, len(ids))
			failed := 0
			seen := map[uuid.UUID]bool{}
			for _, id := range ids {
				if seen[id] {
					continue
				}
				seen[id] = true
				o := idOutcome{ID: id, Outcome: "not found"}
				if r, ok := byID[id]; ok {
					o.Status, o.Outcome = r.Status, "deleted"
					if !r.Deleted {
						o.Outcome = "kept (live)"
					}
				}
				if o.Outcome != "deleted" {
					failed++
				}
				out = append(out, o)
			}
			if err := a.printOutcomes(out, "deleted", len(deleted), removed); err != nil {
				return err
			}
			switch {
			case rerr != nil:
				return rerr
			case failed > 0:
				return fmt.Errorf("%d of %d tasks not deleted: only SUCCEEDED, DEAD and CANCELLED tasks that exist can be deleted", failed, len(out))
			}
			return nil
		},
	}
}

func (a *app) taskRunNowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "run-now ID",
		Short: "Make a QUEUED or RETRYING task that waits for a later time due now",
		Long: `Make a task that waits for a later time (delayed at creation, or RETRYING
after a backoff) due now: it is published at once and the next free worker
runs it. A task already due, RUNNING or finished is refused (exit status 1),
and so is a parked task: run-now does not override its kind's pause or
limits (resume the kind or raise its limit). The audit trail records a
"run now" row naming this invocation (cli:<host>-<pid>).`,
		Example: `  ingest-worker task run-now 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			ids, err := parseTaskIDs(args)
			if err != nil {
				return err
			}
			store, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := store.RunNow(cmd.Context(), a.actor(), ids[0])
			if err != nil {
				return err
			}
			if a.json {
				if err := a.printJSON(map[string]any{"id": ids[0], "outcome": res.Outcome, "status": res.Status, "was_due_at": res.NextRetryAt}); err != nil {
					return err
				}
			} else if res.Outcome == task.RunNowDone {
				a.printf("task %s %s is due now (it was due %s)\n", ids[0], res.Status, timeOrEmpty(res.NextRetryAt))
			}
			if msg := res.Refusal(ids[0]); msg != "" {
				return errors.New(msg)
			}
			return nil
		},
	}
}

// redriveIDs redrives tasks by id through dlq.Redrive (task redrive ID...).
func (a *app) redriveIDs(ctx context.Context, args []string, withDependents bool) error {
	ids, err := parseTaskIDs(args)
	if err != nil {
		return err
	}
	store, _, rdb, key, closeAll, err := a.openWithRedis(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	var redriver dlq.Redriver = store
	withDeps := &task.DependentsRedriver{Store: store}
	if withDependents {
		redriver = withDeps
	}
	res, removed, err := dlq.Redrive(ctx, rdb, key, redriver, a.actor(), ids...)
	if rerr := (*dlq.RemoveError)(nil); err != nil && !errors.As(err, &rerr) {
		return err
	}
	out := make([]idOutcome, len(res))
	failed := 0
	for i, r := range res {
		out[i] = idOutcome{ID: r.ID, Outcome: "redriven", Status: r.Status}
		switch {
		case r.Applied:
		case r.Status == "":
			out[i].Outcome = "not found"
			failed++
		default:
			out[i].Outcome = "refused"
			failed++
		}
	}
	for _, id := range withDeps.Revived {
		out = append(out, idOutcome{ID: id, Outcome: "revived", Status: task.Queued})
	}
	if perr := a.printOutcomes(out, "redriven", len(res)-failed, removed); perr != nil {
		return perr
	}
	switch {
	case err != nil:
		return err
	case failed > 0:
		return fmt.Errorf("%d of %d tasks not redriven: only DEAD and CANCELLED tasks (or waiting ones whose publishing gave up) can be redriven", failed, len(out))
	}
	return nil
}

func (a *app) dlqDiscardCommand() *cobra.Command {
	var taskArg string
	cmd := &cobra.Command{
		Use:   "discard (ENTRY_ID... | --task ID)",
		Short: "Remove DLQ entries and leave their tasks DEAD",
		Long: `Remove the given DLQ entries (ids as 'dlq list' shows them), or with --task
every entry of one task, without redriving anything: the tasks stay DEAD,
kept for inspection until deleted ('task delete'). Each removal is logged
with this invocation (cli:<host>-<pid>). The exit status is 1 when an entry
was not found.`,
		Example: `  ingest-worker dlq discard 1718000000000-0
  ingest-worker dlq discard --task 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			switch {
			case taskArg != "" && len(args) > 0:
				return usagef("give entry ids or --task, not both")
			case taskArg == "" && len(args) == 0:
				return usagef("give the DLQ entry ids to discard, or --task ID")
			case a.cfg.DLQStreamKey == "":
				return usagef("no DLQ stream is configured (INGEST_REDIS_DLQ_STREAM_KEY is empty)")
			}
			var id uuid.UUID
			if taskArg != "" {
				var err error
				if id, err = uuid.Parse(taskArg); err != nil {
					return usagef("--task %q is not a task id (a UUID)", taskArg)
				}
			}
			for i, e := range args {
				if !dlq.ValidEntryID(e) {
					return usagef("argument %d: %q is not a DLQ entry id (MS-SEQ, as 'dlq list' shows)", i+1, e)
				}
			}
			ctx := cmd.Context()
			rdb, err := a.openRedis(ctx)
			if err != nil {
				return err
			}
			defer rdb.Close()
			key := a.cfg.DLQStreamKey
			if taskArg != "" {
				n, err := dlq.RemoveTasks(ctx, rdb, key, []uuid.UUID{id})
				if err != nil {
					return err
				}
				if n > 0 {
					a.log.Info("DLQ entries discarded", "task_id", id, "entries", n, "actor", a.actor())
				}
				if a.json {
					if err := a.printJSON(map[string]any{"task_id": id, "removed": n}); err != nil {
						return err
					}
				} else {
					a.printf("task %s: %d DLQ entries discarded\n", id, n)
				}
				if n == 0 {
					return fmt.Errorf("task %s has no DLQ entry", id)
				}
				return nil
			}
			res, err := dlq.Discard(ctx, rdb, key, args...)
			missing := 0
			for _, d := range res {
				if d.Removed {
					a.log.Info("DLQ entry discarded", "entry_id", d.EntryID, "task_id", d.TaskID, "actor", a.actor())
				} else {
					missing++
				}
			}
			if a.json {
				if jerr := a.printJSON(map[string]any{"results": orEmpty(res)}); jerr != nil && err == nil {
					err = jerr
				}
			} else {
				rows := make([][]string, len(res))
				for i, d := range res {
					outcome := "discarded"
					if !d.Removed {
						outcome = "not found"
					}
					rows[i] = []string{d.EntryID, d.TaskID, outcome}
				}
				a.table([]string{"ENTRY", "TASK", "OUTCOME"}, rows)
			}
			switch {
			case err != nil:
				return err
			case missing > 0:
				return fmt.Errorf("%d of %d DLQ entries not found", missing, len(res))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&taskArg, "task", "", "discard every DLQ entry of this task")
	return cmd
}
