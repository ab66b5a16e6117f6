package main

import (
	"errors"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/task"
)

func (a *app) kindCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kind",
		Short: "List task kinds; pause or resume one",
		Long: `'kind list' shows every kind with tasks or settings: paused or not, its tasks
by status, how many run now and how many are parked. 'kind pause KIND' stops
the kind's tasks from starting on every worker within about a second (running
ones finish; a waiting task is parked: no failed attempt, no consumer slot);
'kind resume KIND' publishes every parked task again. Both are recorded in
ingest_kind_change with this invocation (cli:<host>-<pid>).`,
	}
	cmd.AddCommand(a.kindListCommand(), a.kindPauseCommand(true), a.kindPauseCommand(false))
	return cmd
}

func (a *app) kindListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "Every kind: paused, tasks by status, running, parked",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			store, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			kinds, err := store.Kinds(cmd.Context())
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"kinds": orEmpty(kinds)})
			}
			rows := make([][]string, len(kinds))
			for i, k := range kinds {
				state := "active"
				if k.Paused {
					state = "paused"
				}
				n := func(s task.State) string { return strconv.FormatInt(k.Counts[s], 10) }
				rows[i] = []string{k.Kind, state, n(task.Queued), n(task.Retrying), strconv.FormatInt(k.Running, 10),
					strconv.FormatInt(k.Parked, 10), n(task.Succeeded), n(task.Dead), n(task.Cancelled)}
			}
			a.table([]string{"KIND", "STATE", "QUEUED", "RETRYING", "RUNNING", "PARKED", "SUCCEEDED", "DEAD", "CANCELLED"}, rows)
			return nil
		},
	}
}

func (a *app) kindPauseCommand(pause bool) *cobra.Command {
	use, short := "resume KIND", "Resume a kind: its parked tasks are published again"
	if pause {
		use, short = "pause KIND", "Pause a kind: its tasks start nowhere until resumed"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			store, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			released, err := store.SetPaused(cmd.Context(), a.actor(), args[0], pause)
			if ferr := (*task.FieldError)(nil); errors.As(err, &ferr) {
				return usagef("%s", ferr.Msg)
			}
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"kind": args[0], "paused": pause, "released": released})
			}
			if pause {
				a.printf("kind %s paused: its tasks start nowhere from within a second; running ones finish\n", args[0])
			} else {
				a.printf("kind %s resumed: %d parked tasks published again\n", args[0], released)
			}
			return nil
		},
	}
}
