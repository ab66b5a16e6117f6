package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/maintenance"
)

func (a *app) periodicCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "periodic",
		Short: "Show the periodic schedules of INGEST_PERIODIC and the next slot of each",
		Long: `Show every periodic schedule of INGEST_PERIODIC with its next slot and the
idempotency key of the task that slot creates. Slots are a function of the
schedule alone, so this is what the elected leader will create, on any host;
a running worker answers the same at GET /v1/periodic.`,
		Example: `  INGEST_PERIODIC='[{"kind":"sync","every":"30s"}]' ingest-worker periodic
  ingest-worker periodic --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			slots := maintenance.NextSlots(a.cfg.periodic(), time.Now())
			if a.json {
				return a.printJSON(map[string]any{"schedules": slots})
			}
			if len(slots) == 0 {
				a.notef("no periodic schedules (INGEST_PERIODIC is empty)\n")
				return nil
			}
			rows := make([][]string, len(slots))
			for i, s := range slots {
				rows[i] = []string{s.Name, s.Kind, s.At.Local().Format(time.DateTime), relative(s.At), s.IdempotencyKey}
			}
			a.table([]string{"NAME", "KIND", "NEXT SLOT", "IN", "IDEMPOTENCY KEY"}, rows)
			return nil
		},
	}
	addFlags(cmd.Flags(), scopeWorker)
	return cmd
}
