package main

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/task"
)

func (a *app) kindCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kind",
		Short: "List task kinds; pause, resume or limit one",
		Long: `'kind list' shows every kind with tasks or settings: paused or not, its limits,
its tasks by status, how many run now, how many are parked and the starts per
second observed over the last 10 s. 'kind pause KIND' stops the kind's tasks
from starting on every worker within about a second (running ones finish; a
waiting task is parked: no failed attempt, no consumer slot); 'kind resume
KIND' publishes the parked tasks again. 'kind set KIND --concurrency N --rate
5/s' limits the kind across all workers: at most N tasks RUNNING at once, at
most 5 starts in any second (0: no limit); tasks beyond a limit wait parked.
'kind blocked [KIND]' lists the sequence keys held by a DEAD task.
Every change is recorded in ingest_kind_change with this invocation
(cli:<host>-<pid>).`,
	}
	cmd.AddCommand(a.kindListCommand(), a.kindPauseCommand(true), a.kindPauseCommand(false), a.kindSetCommand(), a.kindBlockedCommand())
	return cmd
}

func (a *app) kindListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "Every kind: paused, limits, tasks by status, running, parked, start rate",
		Long: `Every kind that has tasks or settings. Columns:
  STATE        active (its tasks start) or paused ('kind pause')
  CONCURRENCY  most tasks of the kind RUNNING at once across all workers
               ('kind set --concurrency'; -: no limit)
  RATE         most starts per period ('kind set --rate'; -: no limit)
  QUEUED .. CANCELLED  tasks of the kind in each state
  PARKED       waiting tasks held in PostgreSQL by a pause or a limit
  BLOCKED      sequence keys held by a DEAD task ('kind blocked')
  STARTS/S     starts per second of the kind over the last 10 seconds`,
		Args: cobra.NoArgs,
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
				conc := "-"
				if k.Concurrency > 0 {
					conc = strconv.Itoa(k.Concurrency)
				}
				rate := k.Rate
				if rate == "0" {
					rate = "-"
				}
				perGroup := "-"
				if k.ConcurrencyPerGroup > 0 || k.RatePerGroup != "0" {
					perGroup = strings.Trim(limitDash(strconv.Itoa(k.ConcurrencyPerGroup))+" "+limitDash(k.RatePerGroup), " ")
				}
				rows[i] = []string{k.Kind, state, conc, rate, perGroup, n(task.Queued), n(task.Retrying), strconv.FormatInt(k.Running, 10),
					strconv.FormatInt(k.Parked, 10), n(task.Succeeded), n(task.Dead), n(task.Cancelled),
					strconv.FormatFloat(k.StartRate, 'f', 1, 64), strconv.FormatInt(k.BlockedSequences, 10)}
			}
			a.table([]string{"KIND", "STATE", "CONCURRENCY", "RATE", "PER GROUP", "QUEUED", "RETRYING", "RUNNING", "PARKED", "SUCCEEDED", "DEAD", "CANCELLED", "STARTS/S", "BLOCKED"}, rows)
			return nil
		},
	}
}

func (a *app) kindPauseCommand(pause bool) *cobra.Command {
	use, short := "resume KIND", "Resume a kind: its parked tasks are published again"
	if pause {
		use, short = "pause KIND", "Pause a kind: its tasks start nowhere until resumed"
	}
	var force bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `.
A kind that has no tasks and no settings yet is set with a warning on
stderr (a typo would otherwise succeed silently); --force silences it, for
a kind whose tasks are still to come.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			_, released, err := a.changeKind(cmd.Context(), args[0], task.KindUpdate{Paused: &pause}, force)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"kind": args[0], "paused": pause, "released": released})
			}
			if pause {
				a.printf("kind %s paused: its tasks start nowhere from within a second; running ones finish\n", args[0])
			} else {
				noun := "tasks"
				if released == 1 {
					noun = "task"
				}
				a.printf("kind %s resumed: %d parked %s published again\n", args[0], released, noun)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "set a kind that has no tasks and no settings yet without a warning")
	return cmd
}

func (a *app) kindSetCommand() *cobra.Command {
	var concurrency, perGroup, window int
	var rate, groupRate, onFailure string
	var weights []string
	var force bool
	cmd := &cobra.Command{
		Use:   "set KIND [--concurrency N] [--rate COUNT/PERIOD] [--concurrency-per-group N] [--rate-per-group COUNT/PERIOD] [--group-window N] [--group-weight GROUP=W]... [--sequence-on-failure block|continue]",
		Short: "Limit a kind across all workers: concurrency and start rate, per kind and per group (0: no limit); its sequences' failure policy",
		Long: `Sets the kind's limits, applied by every worker within about a second:
--concurrency N: at most N tasks of the kind RUNNING at once (a slot freed by
a crashed worker comes back when its lease expires); --rate 5/s, 300/m,
10/500ms: at most that many starts in any window of that length. 0 removes a
limit. --concurrency-per-group and --rate-per-group limit each group of the
kind (a task's group_key; the tasks without one are one group) the same way,
together with the kind's limits. --group-window N: at most N tasks of one
group in the stream or running at once; ready tasks are served round-robin
across groups (0: the default, 100; never more than --concurrency-per-group
when it is set). --group-weight GROUP=W (repeatable) gives
a group a weight from 1 to 100: its window is W times the kind's, and it
gets W turns in each round of the release, so groups kept busy share the
kind in proportion to their weights (1, the default, removes a weight;
other groups keep theirs). Tasks beyond a limit wait parked in PostgreSQL (no failed attempt, no
consumer slot) and start as slots and starts free. A kind that has no tasks
and no settings yet is set with a warning on stderr (a typo would otherwise
succeed silently); --force silences it, for a kind whose tasks are still to
come. --sequence-on-failure block (the default) keeps the later tasks of a
sequence key waiting while a DEAD task of it is not redriven or deleted;
continue lets them go on (and releases those waiting now).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			var u task.KindUpdate
			if cmd.Flags().Changed("sequence-on-failure") {
				u.SequenceOnFailure = &onFailure
			}
			if cmd.Flags().Changed("concurrency") {
				u.Concurrency = &concurrency
			}
			if cmd.Flags().Changed("rate") {
				r, err := task.ParseRate(rate)
				if err != nil {
					return usagef("--rate: %s", fieldMsg(err))
				}
				u.Rate = &r
			}
			if cmd.Flags().Changed("concurrency-per-group") {
				u.ConcurrencyPerGroup = &perGroup
			}
			if cmd.Flags().Changed("rate-per-group") {
				r, err := task.ParseGroupRate(groupRate)
				if err != nil {
					return usagef("--rate-per-group: %s", fieldMsg(err))
				}
				u.RatePerGroup = &r
			}
			if cmd.Flags().Changed("group-window") {
				u.GroupWindow = &window
			}
			if len(weights) > 0 {
				var err error
				if u.GroupWeights, err = parseGroupWeights(weights); err != nil {
					return err
				}
			}
			if u.Concurrency == nil && u.Rate == nil && u.ConcurrencyPerGroup == nil && u.RatePerGroup == nil && u.GroupWindow == nil && u.SequenceOnFailure == nil &&
				u.GroupWeights == nil {
				return usagef("kind set needs --concurrency, --rate, --concurrency-per-group, --rate-per-group or --group-window (0 removes a limit), --group-weight or --sequence-on-failure")
			}
			k, released, err := a.changeKind(cmd.Context(), args[0], u, force)
			if err != nil {
				return err
			}
			if a.json {
				return a.printJSON(map[string]any{"kind": args[0], "paused": k.Paused, "concurrency": k.Concurrency, "rate": k.Rate,
					"concurrency_per_group": k.ConcurrencyPerGroup, "rate_per_group": k.RatePerGroup, "group_window": k.GroupWindow,
					"group_weights": orEmptyMap(k.GroupWeights), "sequence_on_failure": k.SequenceOnFailure, "released": released})
			}
			a.printf("kind %s: concurrency %s, rate %s, sequence on failure %s; %d parked tasks released\n", args[0],
				limitText(strconv.Itoa(k.Concurrency)), limitText(k.Rate), k.SequenceOnFailure, released)
			if k.ConcurrencyPerGroup > 0 || k.RatePerGroup != "0" || k.GroupWindow > 0 || len(k.GroupWeights) > 0 {
				a.printf("  per group: concurrency %s, rate %s, window %s\n", limitText(strconv.Itoa(k.ConcurrencyPerGroup)), limitText(k.RatePerGroup), windowText(k.GroupWindow))
			}
			if len(k.GroupWeights) > 0 {
				a.printf("  group weights (others 1): %s\n", weightsText(k.GroupWeights))
			}
			return nil
		},
	}
	rangeFlag(cmd.Flags(), &concurrency, "concurrency", "", task.ConcurrencyRange, 0, "most tasks of the kind RUNNING at once across all workers (0: no limit)")
	cmd.Flags().StringVar(&rate, "rate", "", "most starts per period across all workers: 5/s, 300/m, 10/500ms (0: no limit)")
	cmd.Flags().StringVar(&onFailure, "sequence-on-failure", "", "what a DEAD task does to its sequence key: block (the default) or continue")
	rangeFlag(cmd.Flags(), &perGroup, "concurrency-per-group", "", task.ConcurrencyPerGroupRange, 0, "most tasks of one group of the kind RUNNING at once across all workers (0: no limit)")
	cmd.Flags().StringVar(&groupRate, "rate-per-group", "", "most starts of one group per period across all workers: 5/s, 300/m (0: no limit)")
	rangeFlag(cmd.Flags(), &window, "group-window", "", task.GroupWindowRange, 0, "most tasks of one group in the stream or running at once (0: the default, 100; at most the concurrency per group)")
	cmd.Flags().StringArrayVar(&weights, "group-weight", nil, "GROUP=W: the group's weight, 1 to 100 (1: the default); repeat for several groups")
	cmd.Flags().BoolVar(&force, "force", false, "set a kind that has no tasks and no settings yet without a warning")
	return cmd
}

// parseGroupWeights reads --group-weight values, GROUP=W each (the
// group key may itself hold '=': the weight follows the last one).
func parseGroupWeights(vals []string) (map[string]int, error) {
	out := make(map[string]int, len(vals))
	for _, v := range vals {
		i := strings.LastIndexByte(v, '=')
		if i < 0 {
			return nil, usagef("--group-weight %q: want GROUP=WEIGHT, e.g. tenant-a=3", v)
		}
		w, err := strconv.Atoi(v[i+1:])
		if err != nil {
			return nil, usagef("--group-weight %q: the weight %q is not a whole number from %d to %d", v, v[i+1:], task.GroupWeightRange.Min, task.GroupWeightRange.Max)
		}
		out[v[:i]] = w
	}
	return out, nil
}

// weightsText shows group weights as "a=3, b=2", by group key.
func weightsText(w map[string]int) string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Itoa(w[k])
	}
	return strings.Join(parts, ", ")
}

// orEmptyMap is m, or an empty map for nil (JSON {} rather than null).
func orEmptyMap(m map[string]int) map[string]int {
	if m == nil {
		return map[string]int{}
	}
	return m
}

// limitDash shows a limit, "0" as "" (none).
func limitDash(v string) string {
	if v == "0" {
		return ""
	}
	return v
}

// windowText shows a group window, 0 as the default's value.
func windowText(n int) string {
	if n == 0 {
		return strconv.Itoa(task.DefaultGroupWindow) + " (default)"
	}
	return strconv.Itoa(n)
}

// limitText shows a limit, "0" as "no limit".
func limitText(v string) string {
	if v == "0" {
		return "no limit"
	}
	return v
}

// fieldMsg returns the message of a task.FieldError, or the error's text.
func fieldMsg(err error) string {
	if ferr := (*task.FieldError)(nil); errors.As(err, &ferr) {
		return ferr.Msg
	}
	return err.Error()
}

// changeKind changes kind's settings as this invocation and returns the
// kind after the change and how many parked tasks it released; a bad
// setting is a usage error.
func (a *app) changeKind(ctx context.Context, kind string, u task.KindUpdate, force bool) (task.KindInfo, int, error) {
	store, pool, err := a.openStore(ctx)
	if err != nil {
		return task.KindInfo{}, 0, err
	}
	defer pool.Close()
	if !force {
		if strings.TrimSpace(kind) == "" {
			return task.KindInfo{}, 0, usagef("kind is empty")
		}
		if ferr := task.CheckName("kind", kind, task.MaxKindLength); ferr != nil {
			return task.KindInfo{}, 0, usagef("%s", ferr.Msg)
		}
		if _, known, err := store.Kind(ctx, kind); err != nil {
			return task.KindInfo{}, 0, err
		} else if !known {
			a.notef("warning: kind %q has no tasks and no settings yet; setting it anyway: check the name ('ingest-worker kind list' shows the kinds); --force silences this warning\n", kind)
		}
	}
	released, err := store.SetKind(ctx, a.actor(), kind, u)
	if ferr := (*task.FieldError)(nil); errors.As(err, &ferr) {
		return task.KindInfo{}, 0, usagef("%s", ferr.Msg)
	}
	if err != nil {
		return task.KindInfo{}, 0, err
	}
	k, _, err := store.Kind(ctx, kind)
	return k, released, err
}
