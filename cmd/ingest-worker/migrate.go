package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/migrations"
)

func (a *app) migrateCommand() *cobra.Command {
	var status bool
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the PostgreSQL schema (--status: only show it)",
		Long: `Apply every pending schema migration to the database of INGEST_DATABASE_URL.

Running it again is harmless: an up-to-date schema is left alone. Several
processes may run it at once (an advisory lock serialises them). Behind a
transaction-pooling PgBouncer it applies through INGEST_DATABASE_LISTEN_URL,
a direct connection (the lock needs a session), and refuses without it;
--status works through the pooler. 'run' refuses
to start against a schema older than the binary, so run this first after an
upgrade. With --status it only reports the schema version and what is
pending, changing nothing.`,
		Example: `  ingest-worker migrate
  ingest-worker migrate --status
  ingest-worker migrate --status --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			pool, err := a.openDB(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if status {
				st, err := migrations.GetStatus(cmd.Context(), pool)
				if err != nil {
					return err
				}
				if a.json {
					return a.printJSON(map[string]any{"current": st.Current, "latest": st.Latest, "pending": orEmpty(st.Pending), "up_to_date": st.UpToDate() && len(st.Pending) == 0})
				}
				a.printf("database schema version: %d\nthis build's version:    %d\n", st.Current, st.Latest)
				switch {
				case st.Current > st.Latest:
					a.printf("the database is newer than this build: upgrade ingest-worker\n")
				case len(st.Pending) > 0:
					a.printf("pending migrations:      %s (run 'ingest-worker migrate')\n", joinInts(st.Pending))
				default:
					a.printf("up to date\n")
				}
				return nil
			}
			mpool, closeMigrationDB, err := a.openMigrationDB(cmd.Context(), pool)
			if err != nil {
				return err
			}
			defer closeMigrationDB()
			applied, err := migrations.Up(cmd.Context(), mpool)
			if err != nil {
				return err
			}
			st, err := migrations.GetStatus(cmd.Context(), pool)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"applied": orEmpty(applied), "current": st.Current})
			}
			if len(applied) == 0 {
				a.printf("schema up to date at version %d: nothing to apply\n", st.Current)
				return nil
			}
			a.printf("applied migration(s) %s: schema now at version %d\n", joinInts(applied), st.Current)
			return nil
		},
	}
	cmd.Flags().BoolVar(&status, "status", false, "show the schema version and pending migrations; change nothing")
	return cmd
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func joinInts(vs []int64) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}
