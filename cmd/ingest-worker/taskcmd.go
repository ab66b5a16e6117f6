package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/humantime"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

func (a *app) taskCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Show, list, cancel or redrive tasks",
		Long: `Inspect tasks: 'task show ID' for one task in depth, 'task list' for many;
'task cancel ID' cancels one; 'task redrive' redrives DEAD or CANCELLED tasks
by filter; 'task wait ID' waits for one to end.`,
	}
	cmd.AddCommand(a.taskShowCommand(), a.taskListCommand(), a.taskCancelCommand(), a.taskRedriveCommand(),
		a.taskDeleteCommand(), a.taskRunNowCommand(), a.taskWaitCommand())
	return cmd
}

func (a *app) taskRedriveCommand() *cobra.Command {
	var (
		f            task.RedriveFilter
		status       string
		since, until string
		dryRun       bool
		rate         float64
		withDeps     bool
	)
	cmd := &cobra.Command{
		Use:   "redrive (ID... | --status DEAD|CANCELLED [filters])",
		Short: "Redrive the DEAD or CANCELLED tasks that a filter selects",
		Long: `Send DEAD or CANCELLED tasks back to QUEUED (attempts reset, a new outbox
event each), selected by status, kind, a substring of last_error (case-
sensitive) and a window on finished_at (when they went DEAD or CANCELLED),
newest first, at most --limit of them. --dry-run lists what would be redriven
and changes nothing: run it first. The redrive goes in transactions of 500
tasks, at most --rate tasks per second, so a large backlog does not flood the
queue; each task's audit row names this invocation (cli:<host>-<pid>). The
DLQ entries of the redriven tasks are removed, as 'dlq replay' does. Prints
the ids, then "matched N, redriven N" on standard error (--json: one object).
Given task ids instead of filters, it redrives exactly those tasks (and
removes their DLQ entries), printing a line per id; the exit status is 1
when an id was not redriven. With --with-dependents (ids only) the
dependents their ends cancelled are revived too (and theirs): QUEUED again,
held until their dependencies end anew, each printed as "revived".`,
		Example: `  ingest-worker task redrive --status DEAD --kind embed --error-contains "upstream 503" --dry-run
  ingest-worker task redrive --status DEAD --kind embed --error-contains "upstream 503" --since 2026-11-24T09:00:00Z --limit 100000
  ingest-worker task redrive 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f
  ingest-worker task redrive --with-dependents 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			if len(args) > 0 {
				for _, name := range []string{"status", "kind", "error-contains", "since", "until", "limit", "dry-run", "rate"} {
					if cmd.Flags().Changed(name) {
						return usagef("give task ids or --%s and the other filters, not both", name)
					}
				}
				return a.redriveIDs(cmd.Context(), args, withDeps)
			}
			if withDeps {
				return usagef("--with-dependents takes task ids, not filters")
			}
			f.Status = task.State(strings.ToUpper(status))
			for _, t := range []struct {
				flag string
				in   string
				out  *time.Time
			}{{"--since", since, &f.Since}, {"--until", until, &f.Until}} {
				if t.in == "" {
					continue
				}
				v, err := time.Parse(time.RFC3339, t.in)
				if err != nil {
					return usagef("%s %q is not an RFC 3339 time (e.g. 2026-11-24T09:00:00Z)", t.flag, t.in)
				}
				*t.out = v
			}
			if err := f.Validate(); err != nil {
				return usageErr(err)
			}
			opts := task.RedriveOptions{DryRun: dryRun, Rate: rate}
			if err := opts.Validate(); err != nil {
				return usagef("--%s", fieldMsg(err))
			}
			ctx := cmd.Context()
			var (
				store *task.Store
				rdb   redis.UniversalClient
				key   string
			)
			if a.mode().dlqStream() == "" || dryRun {
				// No DLQ stream to clean up: Redis is not needed.
				s, pool, err := a.openStore(ctx)
				if err != nil {
					return err
				}
				defer pool.Close()
				store = s
			} else {
				pool, client, closeAll, err := a.openServers(ctx)
				if err != nil {
					return err
				}
				defer closeAll()
				if store, err = task.NewStore(a.storeConfig(), pool); err != nil {
					return usageErr(err)
				}
				rdb, key = client, a.cfg.DLQStreamKey
			}
			res, err := dlq.RedriveMatching(ctx, rdb, key, store, a.actor(), f, opts)
			if a.json {
				if jerr := a.printJSON(res); err == nil {
					err = jerr
				}
				return err
			}
			for _, id := range res.IDs {
				a.printf("%s\n", id)
			}
			if dryRun {
				a.notef("dry run: matched %d, would redrive them; nothing changed\n", res.Matched)
			} else {
				a.notef("matched %d, redriven %d, DLQ entries removed %d\n", res.Matched, res.Redriven, res.DLQRemoved)
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&status, "status", "", "DEAD or CANCELLED (required)")
	fl.StringVar(&f.Kind, "kind", "", "only tasks of this kind")
	fl.StringVar(&f.ErrorContains, "error-contains", "", "only tasks whose last_error contains this (case-sensitive)")
	fl.StringVar(&since, "since", "", "only tasks that finished at or after this RFC 3339 time")
	fl.StringVar(&until, "until", "", "only tasks that finished before this RFC 3339 time")
	rangeFlag(fl, &f.Limit, "limit", "", task.RedriveLimitRange, task.DefaultRedriveLimit, "most tasks matched")
	fl.BoolVar(&dryRun, "dry-run", false, "list what would be redriven; change nothing")
	fl.BoolVar(&withDeps, "with-dependents", false, "with task ids: also revive the dependents their ends cancelled")
	fl.Float64Var(&rate, "rate", task.DefaultRedriveRate, fmt.Sprintf("most tasks redriven per second (%g..%g)", float64(task.MinRedriveRate), float64(task.MaxRedriveRate)))
	return cmd
}

func (a *app) taskCancelCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a task (QUEUED, RETRYING or RUNNING)",
		Long: `Cancel a task. A QUEUED or RETRYING task is CANCELLED at once. For a RUNNING
task the cancel is requested: the worker running it cancels its handler's
context within about a second, and the task ends CANCELLED when the handler
returns (follow it with 'task show'). A SUCCEEDED, DEAD or CANCELLED task cannot
be cancelled (exit status 1). The audit trail records the reason and this
invocation (cli:<host>-<pid>). A CANCELLED task can be redriven with
POST /v1/tasks/{id}/redrive.`,
		Example: `  ingest-worker task cancel 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f
  ingest-worker task cancel 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f --reason "customer withdrew"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			id, err := parseTaskID(args[0])
			if err != nil {
				return err
			}
			if len(reason) > task.MaxCancelReasonBytes {
				return usagef("--reason is %d bytes, the limit is %d", len(reason), task.MaxCancelReasonBytes)
			}
			store, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := store.Cancel(cmd.Context(), a.actor(), reason, id)
			if err != nil {
				return err
			}
			if a.json {
				if err := a.printJSON(map[string]any{"outcome": res.Outcome, "task": res.Task}); err != nil {
					return err
				}
			}
			switch res.Outcome {
			case task.CancelDone:
				if !a.json {
					a.printf("task %s CANCELLED\n", id)
				}
			case task.CancelRequested:
				if !a.json {
					a.printf("task %s is RUNNING on %s: cancel requested; it ends CANCELLED when its handler returns\n", id, res.Task.LeaseOwner)
				}
			default:
				return fmt.Errorf("task %s is %s; only QUEUED, RETRYING and RUNNING tasks can be cancelled", id, res.Task.Status)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the audit trail)")
	return cmd
}

// outboxRow is one outbox_event of a task.
type outboxRow = outbox.Event

// entryState is what Redis holds about one stream entry of a task.
type entryState = stream.EntryState

// taskDetail is the JSON output of task show.
type taskDetail struct {
	Task        task.Task           `json:"task"`
	Transitions []transition.Record `json:"transitions"`
	// Graph is the task's ancestors and descendants (dependencies), each
	// once, at most graphLimit with the task; absent: none. GraphCut says
	// some were left out.
	Graph    []task.GraphNode `json:"dependency_graph,omitempty"`
	GraphCut bool             `json:"dependency_graph_cut,omitempty"`
	Outbox   []outboxRow      `json:"outbox_events"`
	Redis    struct {
		Stream  string       `json:"stream"`
		Group   string       `json:"group"`
		Entries []entryState `json:"entries"`
		DLQ     []dlq.Entry  `json:"dlq_entries"`
		// DLQScanned is how many DLQ entries were searched (newest first).
		DLQScanned int    `json:"dlq_scanned"`
		Error      string `json:"error,omitempty"`
	} `json:"redis"`
	// Kafka is the Kafka view (INGEST_QUEUE=kafka) instead of Redis'.
	Kafka *kafkaTaskView `json:"kafka,omitempty"`
}

func (a *app) taskShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show a task: its row, transitions, outbox events and Redis state",
		Long: `Show everything known about one task: its row in ingest_task (payload
included), every transition in its audit trail, its outbox events, and for each
stream entry whether it is in the stream, pending (and with which consumer, idle
for how long, delivered how many times), and the task's DLQ entries.`,
		Example: `  ingest-worker task show 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f
  ingest-worker task show 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f --json | jq .transitions`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			id, err := parseTaskID(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			store, pool, err := a.openStore(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			var d taskDetail
			d.Task, d.Transitions, err = store.GetWithTransitions(ctx, id)
			if err != nil {
				return err
			}
			if d.Outbox, err = outboxOf(ctx, pool, id); err != nil {
				return err
			}
			if d.Graph, d.GraphCut, err = graphOf(ctx, pool, id); err != nil {
				return err
			}
			d.Redis.Stream, d.Redis.Group = a.cfg.StreamKey, a.cfg.Group
			d.Redis.Entries, d.Redis.DLQ = []entryState{}, []dlq.Entry{}
			a.mode().showQueue(ctx, &d)
			if a.json {
				return a.printJSON(d)
			}
			a.printTask(d)
			return nil
		},
	}
}

func outboxOf(ctx context.Context, pool *pgxpool.Pool, id uuid.UUID) ([]outboxRow, error) {
	out, err := outbox.TaskEvents(ctx, pool, id)
	return orEmpty(out), err
}

// redisStateOf fills in the Redis state of the task's stream entries and
// its DLQ entries.
func (a *app) redisStateOf(ctx context.Context, rdb redis.UniversalClient, d *taskDetail) error {
	for _, o := range d.Outbox {
		if o.StreamID == "" {
			continue
		}
		e, err := stream.InspectEntry(ctx, rdb, o.Stream, a.cfg.Group, o.StreamID)
		if err != nil {
			return err
		}
		d.Redis.Entries = append(d.Redis.Entries, e)
	}
	if a.cfg.DLQStreamKey == "" {
		return nil
	}
	found, scanned, err := dlq.FindTask(ctx, rdb, a.cfg.DLQStreamKey, d.Task.ID.String(), dlqScanLimit)
	d.Redis.DLQ, d.Redis.DLQScanned = orEmpty(found), scanned
	return err
}

// dlqScanLimit bounds the DLQ entries task show searches.
const dlqScanLimit = 100000

// allowed says how many runs t gets and who decides: the task's own
// max_attempts, or (NULL) the INGEST_REDIS_MAX_ATTEMPTS of the worker that
// records a failure, shown as this invocation's value.
func (a *app) allowed(t task.Task) string {
	if t.MaxAttempts != nil {
		return fmt.Sprintf("%d allowed (the task's max_attempts)", *t.MaxAttempts)
	}
	return fmt.Sprintf("%d allowed (the workers' INGEST_REDIS_MAX_ATTEMPTS; the task sets none)", a.cfg.MaxAttempts)
}

// maxShort is allowed for a table cell: "5", or "10w" when the workers'
// setting applies.
func (a *app) maxShort(t task.Task) string {
	if t.MaxAttempts != nil {
		return strconv.Itoa(*t.MaxAttempts)
	}
	return strconv.Itoa(a.cfg.MaxAttempts) + "w"
}

func (a *app) printTask(d taskDetail) {
	t := d.Task
	kv := [][]string{
		{"id", t.ID.String()},
		{"kind", t.Kind},
		{"status", string(t.Status)},
		{"attempts", fmt.Sprintf("%d failed of %s", t.AttemptCount, a.allowed(t))},
	}
	if t.NextRetryAt != nil {
		kv = append(kv, []string{nextRunLabel(t), fmt.Sprintf("%s (%s)", timeOrEmpty(t.NextRetryAt), relative(*t.NextRetryAt))})
	}
	if note := t.ParkedNote(); note != "" {
		kv = append(kv, []string{"parked", fmt.Sprintf("%s, since %s (%s)", note, timeOrEmpty(t.ParkedAt), relative(*t.ParkedAt))})
	}
	if t.LeaseOwner != "" {
		kv = append(kv, []string{"lease", fmt.Sprintf("%s until %s", t.LeaseOwner, timeOrEmpty(t.LeaseUntil))})
	}
	if t.LastError != "" {
		kv = append(kv, []string{"last error", clip(t.LastError, 200)})
	}
	if t.IdempotencyKey != "" {
		kv = append(kv, []string{"idempotency key", t.IdempotencyKey})
	}
	if t.SequenceKey != "" && t.SequenceNo != nil {
		kv = append(kv, []string{"sequence", fmt.Sprintf("%s, number %d", t.SequenceKey, *t.SequenceNo)})
	}
	kv = append(kv,
		[]string{"created", timeOrEmpty(&t.CreatedAt)},
		[]string{"updated", timeOrEmpty(&t.UpdatedAt)},
	)
	if t.FinishedAt != nil {
		kv = append(kv, []string{"finished", timeOrEmpty(t.FinishedAt)})
	}
	if t.CancelRequestedAt != nil {
		c := fmt.Sprintf("%s by %s", timeOrEmpty(t.CancelRequestedAt), t.CancelRequestedBy)
		if t.CancelReason != "" {
			c += ": " + clip(t.CancelReason, 200)
		}
		kv = append(kv, []string{"cancel", c})
	}
	if p := t.Progress; p != nil {
		kv = append(kv, []string{"progress", progressText(p)})
	}
	kv = append(kv, []string{"payload", payloadText(t)})
	a.table([]string{"TASK", ""}, kv)
	a.printResult(t)
	a.printGraph(t, d.Graph, d.GraphCut)

	a.printf("\nTRANSITIONS (ingest_task_transition)\n")
	rows := make([][]string, len(d.Transitions))
	for i, r := range d.Transitions {
		from := r.From
		if from == "" {
			from = "-"
		}
		rows[i] = []string{r.CreatedAt.Local().Format("2006-01-02 15:04:05.000"), from, r.To, fmt.Sprint(r.AttemptCount), r.Worker, clip(r.Message, 80)}
	}
	a.table([]string{"AT", "FROM", "TO", "ATTEMPTS", "WORKER", "MESSAGE"}, rows)

	a.printf("\nOUTBOX EVENTS (outbox_event)\n")
	rows = rows[:0]
	for _, o := range d.Outbox {
		rows = append(rows, []string{fmt.Sprint(o.ID), o.Status, fmt.Sprint(o.AttemptCount), o.StreamID, timeOrEmpty(&o.CreatedAt), timeOrEmpty(o.SentAt), clip(o.LastError, 60)})
	}
	a.table([]string{"ID", "STATUS", "ATTEMPTS", "STREAM ENTRY", "CREATED", "SENT", "LAST ERROR"}, rows)

	if d.Kafka != nil {
		a.printKafkaTask(d.Kafka)
		return
	}
	a.printf("\nREDIS (stream %s, group %s)\n", d.Redis.Stream, d.Redis.Group)
	if d.Redis.Error != "" {
		a.printf("  could not read Redis: %s\n", d.Redis.Error)
		return
	}
	rows = rows[:0]
	for _, e := range d.Redis.Entries {
		r := []string{e.ID, yesNo(e.InStream), yesNo(e.Pending), "", "", ""}
		if e.Pending {
			r[3], r[4], r[5] = e.Consumer, humantime.Duration(time.Duration(e.IdleMS)*time.Millisecond), fmt.Sprint(e.Deliveries)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		a.printf("  no stream entry yet (the outbox event is not published)\n")
	} else {
		a.table([]string{"ENTRY", "IN STREAM", "PENDING", "CONSUMER", "IDLE", "DELIVERIES"}, rows)
	}
	if a.cfg.DLQStreamKey == "" {
		a.printf("\nDLQ: none configured (INGEST_REDIS_DLQ_STREAM_KEY is empty)\n")
		return
	}
	a.printf("\nDLQ (%s, searched the newest %d entries)\n", a.cfg.DLQStreamKey, d.Redis.DLQScanned)
	if len(d.Redis.DLQ) == 0 {
		a.printf("  no entry for this task\n")
		return
	}
	rows = rows[:0]
	for _, e := range d.Redis.DLQ {
		rows = append(rows, []string{e.ID, e.DeadAt.Local().Format(time.DateTime), fmt.Sprint(e.AttemptCount), e.SourceID, clip(e.LastError, 80)})
	}
	a.table([]string{"ENTRY", "DEAD AT", "ATTEMPTS", "SOURCE ENTRY", "LAST ERROR"}, rows)
	a.printf("  replay with: ingest-worker dlq replay %s\n", d.Redis.DLQ[0].ID)
}

// statusText is a task's status for a table, with why it waits when it
// is parked: "QUEUED, parked (kind paused)", "QUEUED, waiting for a slot".
// parseTaskID parses the ID argument of a task command; a DLQ entry id
// given instead is named as such, with the command that takes it.
func parseTaskID(arg string) (uuid.UUID, error) {
	id, err := uuid.Parse(arg)
	if err == nil {
		return id, nil
	}
	if dlq.ValidEntryID(arg) {
		return uuid.Nil, usagef("ID %q is a DLQ entry id, not a task id (a UUID, as 'task list' shows it): replay a DLQ entry with 'dlq replay ENTRY_ID'", arg)
	}
	return uuid.Nil, usagef("ID %q is not a task id: expected a UUID like 0190f1c2-7f3a-7c1e-9d7e-5a1b2c3d4e5f, as 'task list' shows it", arg)
}

// nextRunLabel names a task's next_retry_at: "next run" for a delayed
// task that has not failed yet, "next retry" after a failed attempt.
func nextRunLabel(t task.Task) string {
	if t.AttemptCount == 0 {
		return "next run"
	}
	return "next retry"
}

func statusText(t task.Task) string {
	if note := t.ParkedNote(); note != "" {
		return string(t.Status) + ", " + note
	}
	return string(t.Status)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// relative says how far t is from now: "in 3.0s" or "2m05s ago", however
// far.
func relative(t time.Time) string { return humantime.Relative(t, time.Now()) }

func (a *app) taskListCommand() *cobra.Command {
	var p task.ListParams
	var status, workflow string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List tasks, newest first",
		Long: `List tasks, newest first. Columns:
  STATUS      the task's state; a parked one says why ("kind paused",
              "waiting for a slot")
  FAILED/MAX  failed attempts so far / runs allowed: "3/5" when the task sets
              its own max_attempts, "3/10w" (w: the workers' setting) when it
              sets none and INGEST_REDIS_MAX_ATTEMPTS of the worker that
              records a failure applies (shown as this invocation's value)
  CREATED     how long ago the task was created
  UPDATED     how long ago its row last changed
  LAST ERROR  the error of its last failed attempt, clipped`,
		Example: `  ingest-worker task list
  ingest-worker task list --status DEAD --kind email --limit 20
  ingest-worker task list --workflow 0190d5e2-7c1a-7b3e-9f00-2a1b3c4d5e6f
  ingest-worker task list --json | jq -r '.tasks[].id'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			if status != "" {
				p.Status = task.State(strings.ToUpper(status))
				if !p.Status.Valid() {
					return usagef("--status %q is not one of %v", status, task.States)
				}
			}
			if workflow != "" {
				id, err := uuid.Parse(workflow)
				if err != nil {
					return usagef("--workflow %q is not a workflow id (the UUID of its root task)", clip(workflow, 100))
				}
				p.Workflow = id
			}
			store, pool, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			tasks, next, err := store.List(cmd.Context(), p)
			if errors.Is(err, task.ErrInvalidTask) {
				return usageErr(err)
			}
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"tasks": orEmpty(tasks), "next_cursor": next})
			}
			rows := make([][]string, len(tasks))
			for i, t := range tasks {
				rows[i] = []string{t.ID.String(), t.Kind, statusText(t), fmt.Sprintf("%d/%s", t.AttemptCount, a.maxShort(t)), ago(t.CreatedAt), ago(t.UpdatedAt), clip(t.LastError, 60)}
			}
			a.table([]string{"ID", "KIND", "STATUS", "FAILED/MAX", "CREATED", "UPDATED", "LAST ERROR"}, rows)
			if next != "" {
				a.notef("more: ingest-worker task list --cursor %s", next)
				if status != "" {
					a.notef(" --status %s", status)
				}
				if p.Kind != "" {
					a.notef(" --kind %s", p.Kind)
				}
				if workflow != "" {
					a.notef(" --workflow %s", p.Workflow)
				}
				a.notef(" --limit %d\n", p.Limit)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&status, "status", "s", "", "only tasks in this state: QUEUED, RUNNING, RETRYING, SUCCEEDED, DEAD or CANCELLED")
	f.StringVarP(&p.Kind, "kind", "k", "", "only tasks of this kind")
	f.StringVar(&workflow, "workflow", "", "only the tasks of this pipeline (its workflow id: the id of its root task)")
	rangeFlag(f, &p.Limit, "limit", "n", task.ListLimitRange, 50, "most tasks shown")
	f.StringVar(&p.Cursor, "cursor", "", "continue a listing (the cursor printed after a full page)")
	return cmd
}

// payloadText is a task's payload for 'task show': the plaintext (cut),
// or what is known of it when it is encrypted under a key this process
// does not hold.
func payloadText(t task.Task) string {
	if e := t.PayloadEncrypted; e != nil {
		return encryptedText(e)
	}
	return clip(string(t.Payload), 200)
}

// encryptedText says that a value is encrypted, and under which key id.
func encryptedText(e *task.Encrypted) string {
	if e.Missing {
		return fmt.Sprintf("encrypted with key id %s (not among INGEST_ENCRYPTION_KEYS)", e.KeyID)
	}
	return fmt.Sprintf("encrypted with key id %s (does not decrypt with that key)", e.KeyID)
}
