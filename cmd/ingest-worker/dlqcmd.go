package main

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/task"
)

func (a *app) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List or replay dead-lettered tasks",
		Long: `The dead-letter stream (INGEST_REDIS_DLQ_STREAM_KEY, default ingest:tasks:dlq)
holds one entry per task that went DEAD: attempts exhausted, a permanent
failure, or a poison message (an entry without a valid task_id).

Replaying an entry redrives its task in PostgreSQL (DEAD → QUEUED, attempts
reset, history kept, a new outbox event in the same transaction) and then
removes the entry.`,
	}
	cmd.AddCommand(a.dlqListCommand(), a.dlqReplayCommand(), a.dlqDiscardCommand())
	return cmd
}

func (a *app) dlqListCommand() *cobra.Command {
	var limit int64
	var oldest bool
	var after string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List DLQ entries, newest first",
		Example: `  ingest-worker dlq list
  ingest-worker dlq list --oldest --limit 500 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			if a.cfg.DLQStreamKey == "" {
				return usagef("no DLQ stream is configured (INGEST_REDIS_DLQ_STREAM_KEY is empty): dead tasks are only in PostgreSQL; try 'ingest-worker task list --status DEAD'")
			}
			if after != "" && !dlq.ValidEntryID(after) {
				return usagef("--after %q is not a DLQ entry id (MS-SEQ, as dlq list shows them)", after)
			}
			rdb, err := a.openRedis(cmd.Context())
			if err != nil {
				return err
			}
			defer rdb.Close()
			entries, err := dlq.List(cmd.Context(), rdb, a.cfg.DLQStreamKey, dlq.ListParams{Count: limit, Newest: !oldest, After: after})
			if err != nil {
				return err
			}
			total, err := rdb.XLen(cmd.Context(), a.cfg.DLQStreamKey).Result()
			if err != nil {
				return fmt.Errorf("xlen %s: %w", a.cfg.DLQStreamKey, err)
			}
			if a.json {
				return a.printJSON(map[string]any{"stream": a.cfg.DLQStreamKey, "length": total, "entries": orEmpty(entries)})
			}
			a.printDLQ(entries)
			a.notef("%d of %d entries in %s\n", len(entries), total, a.cfg.DLQStreamKey)
			if int64(len(entries)) == limit && int64(len(entries)) < total {
				a.notef("more: ingest-worker dlq list --after %s --limit %d", entries[len(entries)-1].ID, limit)
				if oldest {
					a.notef(" --oldest")
				}
				a.notef("\n")
			}
			return nil
		},
	}
	rangeFlag(cmd.Flags(), &limit, "limit", "n", dlqListRange, 100, "most entries shown")
	cmd.Flags().BoolVar(&oldest, "oldest", false, "oldest first")
	cmd.Flags().StringVar(&after, "after", "", "continue after this entry id")
	return cmd
}

func (a *app) printDLQ(entries []dlq.Entry) {
	rows := make([][]string, len(entries))
	for i, e := range entries {
		dead := ""
		if !e.DeadAt.IsZero() {
			dead = e.DeadAt.Local().Format(time.DateTime)
		}
		rows[i] = []string{e.ID, e.TaskID, e.Kind, fmt.Sprint(e.AttemptCount), dead, clip(e.LastError, 70)}
	}
	a.table([]string{"ENTRY", "TASK", "KIND", "ATTEMPTS", "DEAD AT", "LAST ERROR"}, rows)
}

// dlqListRange bounds dlq list --limit.
var dlqListRange = task.Range{Field: "limit", Min: 1, Max: dlq.MaxListCount}

// replayChunk is how many entries one Replay call redrives.
const replayChunk = 500

func (a *app) dlqReplayCommand() *cobra.Command {
	var all, withDeps bool
	cmd := &cobra.Command{
		Use:   "replay (ENTRY_ID... | --all)",
		Short: "Redrive the tasks of DLQ entries and remove the entries",
		Long: `Send the tasks of the given DLQ entries (ids as 'dlq list' shows them) back to
QUEUED, with their attempts reset, and remove the entries. --all replays every
entry of the DLQ. An entry whose task is no longer DEAD is removed without
change; a poison entry (no valid task_id) or one whose task does not exist is
kept and reported. A task id given instead of an entry id is refused (exit 2),
naming the commands that take one: 'task redrive ID' and 'dlq discard --task ID'.
With --with-dependents the dependents the replayed tasks' deaths cancelled
are revived too (and theirs): QUEUED again, held until their dependencies
end anew; they are counted on standard error.`,
		Example: `  ingest-worker dlq replay 1718000000000-0
  ingest-worker dlq replay --with-dependents 1718000000000-0
  ingest-worker dlq replay --all`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			switch {
			case all && len(args) > 0:
				return usagef("give entry ids or --all, not both")
			case !all && len(args) == 0:
				return usagef("give the DLQ entry ids to replay, or --all")
			}
			for _, arg := range args {
				if err := replayArg(arg); err != nil {
					return err
				}
			}
			switch {
			case a.cfg.DLQStreamKey == "":
				return usagef("no DLQ stream is configured (INGEST_REDIS_DLQ_STREAM_KEY is empty); redrive DEAD tasks with POST /v1/tasks/{id}/redrive")
			}
			ctx := cmd.Context()
			pool, rdb, closeAll, err := a.openServers(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			store, err := task.NewStore(a.storeConfig(), pool)
			if err != nil {
				return usageErr(err)
			}
			var redriver dlq.Redriver = store
			deps := &task.DependentsRedriver{Store: store}
			if withDeps {
				redriver = deps
			}
			var results []dlq.ReplayResult
			if all {
				results, err = a.replayAll(ctx, rdb, redriver)
			} else {
				results, err = dlq.Replay(ctx, rdb, a.cfg.DLQStreamKey, redriver, a.actor(), args...)
			}
			if a.json {
				if jerr := a.printJSON(map[string]any{"results": orEmpty(results)}); err == nil {
					err = jerr
				}
				return err
			}
			counts := map[dlq.ReplayOutcome]int{}
			rows := make([][]string, len(results))
			for i, r := range results {
				counts[r.Outcome]++
				task := ""
				if r.TaskID != [16]byte{} {
					task = r.TaskID.String()
				}
				rows[i] = []string{r.EntryID, task, string(r.Outcome), string(r.Status), clip(r.Detail, 80)}
			}
			if len(rows) > 0 {
				a.table([]string{"ENTRY", "TASK", "OUTCOME", "STATUS", "DETAIL"}, rows)
			}
			a.notef("replayed %d, removed %d no longer DEAD, kept %d poison, %d without a task, %d entries not found\n",
				counts[dlq.Replayed], counts[dlq.NotDead], counts[dlq.Poison], counts[dlq.TaskNotFound], counts[dlq.EntryNotFound])
			if withDeps {
				a.notef("revived %d dependents\n", len(deps.Revived))
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "replay every entry of the DLQ")
	cmd.Flags().BoolVar(&withDeps, "with-dependents", false, "also revive the dependents the replayed tasks' deaths cancelled")
	return cmd
}

// replayArg checks that arg is a DLQ entry id, so that a task id or a
// typo is refused with what the argument must be (Redis would answer "ERR
// Invalid stream ID").
func replayArg(arg string) error {
	if dlq.ValidEntryID(arg) {
		return nil
	}
	if _, err := uuid.Parse(arg); err == nil {
		return usagef("ENTRY_ID %q is a task id, not a DLQ entry id (like 1718000000000-0, as 'dlq list' shows it): redrive a task by its id with 'task redrive ID', or drop its DLQ entries with 'dlq discard --task ID'", arg)
	}
	return usagef("ENTRY_ID %q is not a DLQ entry id: expected MILLISECONDS-SEQUENCE like 1718000000000-0, as 'dlq list' shows it (a task is redriven by its id with 'task redrive ID')", arg)
}

// replayAll replays the DLQ from its oldest entry, in chunks.
func (a *app) replayAll(ctx context.Context, rdb redis.UniversalClient, store dlq.Redriver) ([]dlq.ReplayResult, error) {
	var out []dlq.ReplayResult
	after := ""
	for {
		page, err := dlq.List(ctx, rdb, a.cfg.DLQStreamKey, dlq.ListParams{Count: replayChunk, After: after})
		if err != nil || len(page) == 0 {
			return out, err
		}
		ids := make([]string, len(page))
		for i, e := range page {
			ids[i] = e.ID
		}
		res, err := dlq.Replay(ctx, rdb, a.cfg.DLQStreamKey, store, a.actor(), ids...)
		out = append(out, res...)
		if err != nil {
			return out, err
		}
		after = page[len(page)-1].ID
	}
}

// actor names this operator invocation in the audit trail.
func (a *app) actor() string {
	return "cli:" + defaultConsumerName()
}
