package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

func (a *app) enqueueCommand() *cobra.Command {
	var (
		kind, payload, key, file, runAt, seqKey, group string
		maxAttempts, priority                          int
		delay, timeout                                 time.Duration
		dependsOn                                      []string
		onDepFailure                                   string
	)
	cmd := &cobra.Command{
		Use:   "enqueue (--kind K --payload JSON|@file | --file tasks.ndjson)",
		Short: "Create tasks and print their ids",
		Long: `Create a task (or many, from a file) and print its id.

The task is written to PostgreSQL together with its outbox event in one
transaction; a running worker publishes it to the stream and runs it.

--payload is a JSON value, @path to read it from a file, or @- for stdin.
A repeated --idempotency-key (per kind) returns the existing task instead
of creating a second one. Tasks of one kind with the same --sequence-key run
one at a time, in creation order (a DEAD one blocks the later ones unless
the kind's sequence_on_failure is continue: 'kind set').

--run-at (RFC 3339) or --delay (a duration) schedules the task: it stays
QUEUED and is published to the stream, and started, only once it is due
(a time in the past means now). --timeout is the deadline of each run of
its handler (default: the worker's, INGEST_TASK_TIMEOUT_MS). --group names
the task's group (a tenant): the kind's per-group limits hold for each
group, and ready tasks are served round-robin across groups. --priority
is 1 (the highest) to 4 (default 2): among ready tasks, higher priorities
start first, and lower ones keep a share of the reads.

--depends-on ID (repeatable, or comma-separated) makes the task wait for
those tasks: it stays QUEUED, held, until each has ended, and its handler
gets their results. A dependency that ends DEAD or CANCELLED cancels it,
unless --on-dependency-failure run.

--file reads newline-delimited JSON, one task per line:
  {"kind": "email", "payload": {...}, "idempotency_key": "k1", "max_attempts": 5,
   "run_at": "2026-01-02T03:04:05Z", "delay_ms": 60000, "timeout_ms": 30000,
   "ref": "parse", "depends_on": ["fetch", "0190f1c2-..."], "on_dependency_failure": "run",
   "sequence_key": "doc-7", "group_key": "acme", "priority": 1}
(all but kind and payload are optional; run_at and delay_ms exclusive;
depends_on names task ids or the refs of other lines) and
creates all of them in one transaction: all or none. Use --file - for stdin.`,
		Example: `  ingest-worker enqueue --kind email --payload '{"to":"a@example.com"}'
  ingest-worker enqueue --kind report --payload @report.json --idempotency-key report-2024-06 --max-attempts 3
  ingest-worker enqueue --kind report --payload '{}' --run-at 2026-01-02T03:00:00Z --timeout 10m
  ingest-worker enqueue --kind reminder --payload '{"id":7}' --delay 15m
  ingest-worker enqueue --kind reindex --payload '{"doc":42}' --priority 1
  ingest-worker enqueue --kind notify --payload '{}' --depends-on 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f --on-dependency-failure run
  ingest-worker enqueue --file tasks.ndjson --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			var nts []task.NewTask
			var err error
			switch {
			case file != "":
				if kind != "" || payload != "" || key != "" || runAt != "" || seqKey != "" || group != "" ||
					cmd.Flags().Changed("max-attempts") || cmd.Flags().Changed("delay") || cmd.Flags().Changed("timeout") ||
					len(dependsOn) > 0 || onDepFailure != "" || cmd.Flags().Changed("priority") {
					return usagef("--file cannot be combined with --kind, --payload, --idempotency-key, --sequence-key, --group, --max-attempts, --run-at, --delay, --timeout, --priority, --depends-on or --on-dependency-failure (put them in the file's lines)")
				}
				nts, err = a.readNDJSON(file)
			case kind == "":
				return usagef("--kind is required (or --file)")
			case payload == "":
				return usagef("--payload is required: a JSON value, @file or @-")
			default:
				var p []byte
				if p, err = a.readPayload(payload); err != nil {
					return err
				}
				nt := task.NewTask{Kind: kind, Payload: p, IdempotencyKey: key, MaxAttempts: maxAttempts, Delay: delay, Timeout: timeout,
					OnDependencyFailure: onDepFailure, SequenceKey: seqKey, GroupKey: group, Priority: priority}
				for _, d := range dependsOn {
					id, perr := uuid.Parse(strings.TrimSpace(d))
					if perr != nil {
						return usagef("--depends-on %q is not a task id", d)
					}
					nt.DependsOn = append(nt.DependsOn, id)
				}
				switch {
				case runAt != "" && cmd.Flags().Changed("delay"):
					return usagef("--run-at and --delay are exclusive")
				case delay < 0:
					return usagef("--delay must be >= 0, got %s", delay)
				case cmd.Flags().Changed("timeout") && timeout <= 0:
					return usagef("--timeout must be > 0, got %s", timeout)
				case runAt != "":
					at, perr := time.Parse(time.RFC3339Nano, runAt)
					if perr != nil {
						return usagef("--run-at %q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", runAt)
					}
					nt.RunAt = at
				}
				// Checked before connecting, naming the flag.
				if ferr := nt.Validate(a.cfg.MaxPayloadBytes); ferr != nil {
					return usagef("--%s: %s", flagOfField(ferr.Field, enqueueFlags), ferr.Msg)
				}
				nts = []task.NewTask{nt}
			}
			if err != nil {
				return err
			}
			if len(nts) == 0 {
				return usagef("%s holds no tasks", file)
			}
			store, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := store.CreateBatch(cmd.Context(), nts)
			if errors.Is(err, task.ErrInvalidTask) || errors.Is(err, task.ErrPayloadTooLarge) {
				return usageErr(err)
			}
			if err != nil {
				return err
			}
			out := make([]api.CreateResponse, len(res))
			existing := 0
			for i, r := range res {
				out[i] = api.CreateResponse{ID: r.Task.ID, Status: r.Task.Status, Existing: r.Existing}
				if r.Existing {
					existing++
				}
			}
			if a.json {
				if file == "" {
					return a.printJSON(out[0])
				}
				return a.printJSON(map[string]any{"tasks": out})
			}
			for _, e := range out {
				a.printf("%s\n", e.ID)
			}
			switch {
			case file == "" && existing == 1:
				a.notef("(an existing task: the idempotency key %q of kind %s was used before)\n", key, kind)
			case file != "":
				a.notef("%d task(s) in one transaction: %d created, %d existing (idempotency key)\n", len(out), len(out)-existing, existing)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&kind, "kind", "k", "", "task kind (selects the handler)")
	f.StringVarP(&payload, "payload", "p", "", "JSON payload, @file, or @- for stdin")
	f.StringVar(&key, "idempotency-key", "", "a repeat with the same kind and key returns the existing task")
	f.StringVar(&seqKey, "sequence-key", "", "tasks of the kind with this key run one at a time, in creation order")
	rangeFlag(f, &maxAttempts, "max-attempts", "", task.MaxAttemptsRange, 0, "runs before the task is DEAD (default INGEST_REDIS_MAX_ATTEMPTS)")
	f.StringVar(&runAt, "run-at", "", "run the task at this RFC 3339 time, not before")
	f.DurationVar(&delay, "delay", 0, "run the task after this delay (e.g. 90s, 15m), not before")
	f.DurationVar(&timeout, "timeout", 0, "deadline of each run of the handler (default INGEST_TASK_TIMEOUT_MS)")
	f.StringSliceVar(&dependsOn, "depends-on", nil, "wait for this task (repeatable, or comma-separated ids) before running")
	f.StringVar(&onDepFailure, "on-dependency-failure", "", "cancel (default) or run: what a dependency ending DEAD or CANCELLED does")
	f.StringVar(&group, "group", "", "the task's group (a tenant): per-group limits and fair scheduling")
	rangeFlag(f, &priority, "priority", "", task.PriorityRange, stream.DefaultPriority, "1 (highest) to 4; higher priorities start first")
	f.StringVarP(&file, "file", "f", "", "newline-delimited JSON tasks, or - for stdin (all in one transaction)")
	return cmd
}

// enqueueFlags are the flags of enqueue by the task field each sets.
var enqueueFlags = map[string]string{"kind": "kind", "payload": "payload", "idempotency_key": "idempotency-key", "sequence_key": "sequence-key", "priority": "priority",
	"max_attempts": "max-attempts", "run_at": "run-at", "delay_ms": "delay", "timeout_ms": "timeout",
	"depends_on": "depends-on", "on_dependency_failure": "on-dependency-failure", "group_key": "group"}

// readPayload returns --payload's JSON: inline, @file or @-.
func (a *app) readPayload(v string) ([]byte, error) {
	var b []byte
	if name, ok := strings.CutPrefix(v, "@"); ok {
		var err error
		if name == "-" {
			b, err = io.ReadAll(io.LimitReader(a.stdin, int64(a.cfg.MaxPayloadBytes)+1))
		} else {
			b, err = os.ReadFile(name)
		}
		if err != nil {
			return nil, usagef("--payload: %v", err)
		}
	} else {
		b = []byte(v)
	}
	if len(b) > a.cfg.MaxPayloadBytes {
		return nil, usagef("--payload is larger than INGEST_MAX_PAYLOAD_BYTES (%d bytes)", a.cfg.MaxPayloadBytes)
	}
	if _, err := task.Canonical(b); err != nil {
		return nil, usagef("--payload %v", err)
	}
	return bytes.TrimSpace(b), nil
}

// readNDJSON reads tasks, one JSON object per line.
func (a *app) readNDJSON(name string) ([]task.NewTask, error) {
	var r io.Reader = a.stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, usagef("--file: %v", err)
		}
		defer f.Close()
		r = f
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), a.cfg.MaxPayloadBytes+64<<10)
	var nts []task.NewTask
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var t api.CreateRequest
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			return nil, usagef("%s line %d: %v", name, line, err)
		}
		if dec.More() {
			return nil, usagef("%s line %d: more than one JSON value on the line", name, line)
		}
		nt, ferr := t.Validate(a.cfg.MaxPayloadBytes)
		if ferr != nil {
			return nil, usagef("%s line %d: %s", name, line, ferr.Msg)
		}
		nts = append(nts, nt)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, usagef("%s: a line is longer than INGEST_MAX_PAYLOAD_BYTES plus 64 KiB", name)
		}
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return nts, nil
}
