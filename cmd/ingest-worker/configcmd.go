package main

import (
	"github.com/spf13/cobra"
)

// configEntry is one setting in the JSON output of config.
type configEntry struct {
	Env     string `json:"env"`
	Flag    string `json:"flag"`
	Value   string `json:"value"`
	Default string `json:"default"`
	Source  string `json:"source"` // default, env or flag
	Usage   string `json:"usage"`
}

func (a *app) configCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Show every setting: variable, flag, current value and default",
		Long: `Show every setting with its environment variable, its flag, the value this
process would use (secrets masked) and where it came from (flag, env or default).
Invalid values are reported the way 'run' reports them, after the table, with
exit code 2. Any other command stops only for an invalid value of a setting
it uses (a bad INGEST_PERIODIC stops run, demo, ui and periodic, not task
list): it warns about the others and goes on with their defaults.

A flag wins over its variable; the worker settings' flags (--redis-reclaim-idle-ms
and the like) are accepted by 'run' and 'demo', and here to check a value.`,
		Example: `  ingest-worker config
  INGEST_REDIS_RECLAIM_IDLE_MS=60000 ingest-worker config --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// An invalid value is reported after the table, which shows
			// what was given for every setting.
			lerr := a.load(cmd, nil)
			if lerr != nil && len(a.all) == 0 {
				return lerr
			}
			entries := make([]configEntry, len(a.all))
			rows := make([][]string, len(a.all))
			for i, r := range a.all {
				src := [...]string{fromDefault: "default", fromEnv: "env", fromFlag: "flag"}[r.from]
				value := r.display()
				if r.env == "INGEST_CONSUMER_NAME" && r.value == "" && a.cfg != nil {
					value = a.cfg.ConsumerName
				}
				entries[i] = configEntry{Env: r.env, Flag: "--" + r.flagName(), Value: value, Default: r.def, Source: src, Usage: r.usage}
				if value == "" {
					value = `""`
				}
				rows[i] = []string{r.env, "--" + r.flagName(), value, src}
			}
			if a.json {
				if err := a.printJSON(map[string]any{"settings": entries}); err != nil {
					return err
				}
				return lerr
			}
			a.table([]string{"VARIABLE", "FLAG", "VALUE", "FROM"}, rows)
			return lerr
		},
	}
	addFlags(cmd.Flags(), scopeWorker)
	return cmd
}
