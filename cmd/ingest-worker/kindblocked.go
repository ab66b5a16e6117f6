package main

import (
	"strconv"

	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/task"
)

func (a *app) kindBlockedCommand() *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "blocked [KIND]",
		Short: "List the sequence keys held by a DEAD task",
		Long: `Lists the sequences (kind and sequence key) whose head task is DEAD under the
kind's sequence_on_failure block: the later tasks of the key wait until that
task is redriven ('dlq redrive --id', then it must succeed) or deleted
('task delete'), or the kind is set to continue ('kind set
--sequence-on-failure continue'). Columns: KIND, KEY, TASK (the DEAD task),
NO (its place in the sequence), WAITING (held tasks after it), DEAD AT,
ERROR.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			kind := ""
			if len(args) == 1 {
				kind = args[0]
			}
			store, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			seqs, err := store.BlockedSequences(cmd.Context(), kind, limit)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"sequences": orEmpty(seqs)})
			}
			rows := make([][]string, len(seqs))
			for i, s := range seqs {
				rows[i] = []string{s.Kind, s.SequenceKey, s.TaskID.String(), strconv.FormatInt(s.SequenceNo, 10),
					strconv.FormatInt(s.Waiting, 10), timeOrEmpty(s.DeadAt), clip(s.Error, 80)}
			}
			a.table([]string{"KIND", "KEY", "TASK", "NO", "WAITING", "DEAD AT", "ERROR"}, rows)
			return nil
		},
	}
	rangeFlag(cmd.Flags(), &limit, "limit", "", task.ListLimitRange, 100, "most sequences listed")
	return cmd
}
