package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/task"
)

// rotateReport is the output of 'keys rotate'.
type rotateReport struct {
	KeyID      string         `json:"key_id"`
	DryRun     bool           `json:"dry_run"`
	Scanned    int            `json:"scanned"`
	Payloads   int            `json:"payloads"`
	Results    int            `json:"results"`
	Conflicts  int            `json:"conflicts"`
	Unreadable map[string]int `json:"unreadable"`
	// Next is the last task id scanned: --after resumes there.
	Next string `json:"next"`
}

func (a *app) keysCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Encryption keys of payloads and results: re-encrypt under the first key",
		Long: `Payloads and results are encrypted at rest with the keys of
INGEST_ENCRYPTION_KEYS (id:base64-of-32-bytes,...): the first encrypts, all
decrypt. 'keys rotate' re-encrypts what is not under the first key. See
docs/ENCRYPTION.md for the rotation procedure.`,
	}
	cmd.AddCommand(a.keysRotateCommand())
	return cmd
}

func (a *app) keysRotateCommand() *cobra.Command {
	var batch int
	var dryRun bool
	var after string
	cmd := &cobra.Command{
		Use:   "rotate",
		Short: "Re-encrypt payloads and results under the first key of INGEST_ENCRYPTION_KEYS",
		Long: `Re-encrypt, under the first key of INGEST_ENCRYPTION_KEYS, every payload and
result that is not under it: those in clear (written before encryption was
turned on, or by the SQL enqueue function) and those under an older key. It
reads the tasks in id order, --batch-size at a time, and rewrites each batch
in one statement in which every value is guarded by the value it read, so it
runs beside workers and producers: a result written meanwhile is left alone
(counted as a conflict, taken by the next run). Nothing changes state;
payload_sha is rewritten as the first key's digest.

It is idempotent: run it again until it reports nothing to do. Stopped, it
resumes from the start (cheap: values under the first key are skipped) or
from --after, the last id it printed. --dry-run counts without writing.

A value under a key not in INGEST_ENCRYPTION_KEYS is counted as unreadable,
by key id, and left as it is; the command then exits 1. Remove an old key
only once a run reports no unreadable values and nothing left to do.`,
		Example: `  INGEST_ENCRYPTION_KEYS=k2:<new>,k1:<old> ingest-worker keys rotate --dry-run
  INGEST_ENCRYPTION_KEYS=k2:<new>,k1:<old> ingest-worker keys rotate`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			if a.cfg.Keyring == nil {
				return usagef("keys rotate: INGEST_ENCRYPTION_KEYS is empty: there is no key to encrypt with")
			}
			from := uuid.Nil
			if after != "" {
				id, err := uuid.Parse(after)
				if err != nil {
					return usagef("--after %q is not a task id", clip(after, 64))
				}
				from = id
			}
			ctx := cmd.Context()
			store, pool, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			rep := rotateReport{KeyID: a.cfg.Keyring.Primary(), DryRun: dryRun, Unreadable: map[string]int{}, Next: from.String()}
			for {
				b, err := store.Rotate(ctx, from, batch, dryRun)
				if err != nil {
					return fmt.Errorf("keys rotate after %s: %w", from, err)
				}
				rep.Scanned += b.Scanned
				rep.Payloads += b.Payloads
				rep.Results += b.Results
				rep.Conflicts += b.Conflicts
				for k, n := range b.Unreadable {
					rep.Unreadable[k] += n
				}
				from = b.Next
				rep.Next = from.String()
				if b.Done {
					break
				}
			}
			if a.json {
				if err := a.printJSON(rep); err != nil {
					return err
				}
			} else {
				verb := "re-encrypted"
				if dryRun {
					verb = "to re-encrypt"
				}
				a.printf("key %s: %d tasks scanned; %s: %d payloads, %d results; %d conflicts (changed meanwhile: run again)\n",
					rep.KeyID, rep.Scanned, verb, rep.Payloads, rep.Results, rep.Conflicts)
			}
			if len(rep.Unreadable) > 0 {
				var parts []string
				for k, n := range rep.Unreadable {
					parts = append(parts, fmt.Sprintf("%d under key id %s", n, k))
				}
				sort.Strings(parts)
				return errors.New("unreadable values left as they are (their key is not in INGEST_ENCRYPTION_KEYS, or they do not decrypt): " + strings.Join(parts, ", "))
			}
			return nil
		},
	}
	rangeFlag(cmd.Flags(), &batch, "batch-size", "", task.RotateBatchRange, task.DefaultRotateBatch, "tasks read and rewritten per statement")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be re-encrypted; write nothing")
	cmd.Flags().StringVar(&after, "after", "", "resume after this task id (the next of an earlier run)")
	return cmd
}
