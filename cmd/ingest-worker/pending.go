package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/internal/humantime"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// pendingReport is the JSON output of pending.
type pendingReport struct {
	Stream          string             `json:"stream"`
	Group           string             `json:"group"`
	StreamLength    int64              `json:"stream_length"`
	GroupExists     bool               `json:"group_exists"`
	LastDeliveredID string             `json:"last_delivered_id,omitempty"`
	Lag             *int64             `json:"lag,omitempty"` // entries not yet delivered to the group
	Pending         int64              `json:"pending"`
	Consumers       []consumerPending  `json:"consumers"`
	Oldest          []pendingEntryInfo `json:"oldest_pending"`
	// PriorityStreams are the streams of priorities 1, 3 and 4 (the
	// default, 2, is Stream above).
	PriorityStreams []priorityStream `json:"priority_streams"`
	DLQ             *streamLength    `json:"dlq,omitempty"`
	Outbox          outboxBacklog    `json:"outbox"`
	Tasks           map[string]int64 `json:"tasks_by_status"`
}

type consumerPending struct {
	Name    string `json:"name"`
	Pending int64  `json:"pending"`
	IdleMS  int64  `json:"idle_ms"` // since its last read or claim
}

type pendingEntryInfo struct {
	ID         string `json:"id"`
	Consumer   string `json:"consumer"`
	AgeMS      int64  `json:"age_ms"`  // since the entry was added
	IdleMS     int64  `json:"idle_ms"` // since its last delivery or heartbeat
	Deliveries int64  `json:"deliveries"`
}

type priorityStream struct {
	Priority int    `json:"priority"`
	Stream   string `json:"stream"`
	Length   int64  `json:"length"`
	Pending  int64  `json:"pending"`
}

// readPriorityStreams reads the length and the group's pending count of
// the streams of priorities other than the default (missing: empty).
func readPriorityStreams(ctx context.Context, rdb redis.UniversalClient, base, group string) ([]priorityStream, error) {
	var out []priorityStream
	for _, p := range stream.Priorities {
		if p == stream.DefaultPriority {
			continue
		}
		ps := priorityStream{Priority: p, Stream: stream.Key(base, p)}
		g, err := stream.NewGroup(stream.Config{Stream: base, Group: group, Consumer: "cli"}, rdb)
		if err != nil {
			return nil, err
		}
		if ps.Length, ps.Pending, err = g.StatsOf(ctx, ps.Stream); err != nil {
			return nil, err
		}
		out = append(out, ps)
	}
	return out, nil
}

type streamLength struct {
	Stream string `json:"stream"`
	Length int64  `json:"length"`
}

type outboxBacklog struct {
	// Backlog is the number of NEW and RETRYING events that are due (not
	// yet in Redis); OldestAgeMS is how long the oldest of them has been
	// due. Scheduled counts delayed tasks' events whose time has not come.
	Backlog     int64 `json:"backlog"`
	OldestAgeMS int64 `json:"oldest_age_ms,omitempty"`
	Scheduled   int64 `json:"scheduled"`
	Dead        int64 `json:"dead"`
}

func (a *app) pendingCommand() *cobra.Command {
	var oldest int64
	cmd := &cobra.Command{
		Use:   "pending",
		Short: "Show the stream, its pending entries per consumer, and the outbox backlog",
		Long: `Summarise the work in flight: the task stream's length and the group's lag
(entries not yet delivered), XPENDING per consumer (delivered, not yet
acknowledged: running, waiting for a retry, or held by a crashed worker until
the reclaimer takes them), the oldest pending entries with their age and idle
time, the DLQ length, the outbox backlog (tasks committed in PostgreSQL but
not yet published to Redis) and the tasks per status.`,
		Example: `  ingest-worker pending
  ingest-worker pending --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			return a.mode().pending(cmd.Context(), oldest)
		},
	}
	rangeFlag(cmd.Flags(), &oldest, "oldest", "", oldestRange, 5, "how many of the oldest pending entries to show")
	return cmd
}

// oldestRange bounds pending --oldest.
var oldestRange = task.Range{Field: "oldest", Min: 0, Max: 1000}

func (a *app) pendingReport(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient, oldest int64) (*pendingReport, error) {
	rep := &pendingReport{Stream: a.cfg.StreamKey, Group: a.cfg.Group, Consumers: []consumerPending{}, Oldest: []pendingEntryInfo{}, Tasks: map[string]int64{}}
	var err error
	if rep.StreamLength, err = rdb.XLen(ctx, rep.Stream).Result(); err != nil {
		return nil, fmt.Errorf("xlen %s: %w", rep.Stream, err)
	}
	if rep.PriorityStreams, err = readPriorityStreams(ctx, rdb, rep.Stream, rep.Group); err != nil {
		return nil, err
	}
	groups, err := rdb.XInfoGroups(ctx, rep.Stream).Result()
	if err != nil && !stream.IsMissing(err) {
		return nil, fmt.Errorf("xinfo groups %s: %w", rep.Stream, err)
	}
	for _, g := range groups {
		if g.Name == rep.Group {
			rep.GroupExists, rep.LastDeliveredID, rep.Pending = true, g.LastDeliveredID, g.Pending
			// Lag is only meaningful once the group has read (entries-read
			// is null before, and on servers that do not track it).
			if g.Lag == 0 || (g.Lag > 0 && g.EntriesRead > 0) {
				lag := g.Lag
				rep.Lag = &lag
			}
		}
	}
	if rep.GroupExists {
		sum, err := rdb.XPending(ctx, rep.Stream, rep.Group).Result()
		if err != nil {
			return nil, fmt.Errorf("xpending %s %s: %w", rep.Stream, rep.Group, err)
		}
		rep.Pending = sum.Count
		idle := map[string]int64{}
		if cs, err := rdb.XInfoConsumers(ctx, rep.Stream, rep.Group).Result(); err == nil {
			for _, c := range cs {
				idle[c.Name] = c.Idle.Milliseconds()
				if _, ok := sum.Consumers[c.Name]; !ok {
					rep.Consumers = append(rep.Consumers, consumerPending{Name: c.Name, IdleMS: c.Idle.Milliseconds()})
				}
			}
		}
		for name, n := range sum.Consumers {
			rep.Consumers = append(rep.Consumers, consumerPending{Name: name, Pending: n, IdleMS: idle[name]})
		}
		sort.Slice(rep.Consumers, func(i, j int) bool {
			if rep.Consumers[i].Pending != rep.Consumers[j].Pending {
				return rep.Consumers[i].Pending > rep.Consumers[j].Pending
			}
			return rep.Consumers[i].Name < rep.Consumers[j].Name
		})
		if oldest > 0 && sum.Count > 0 {
			ext, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: rep.Stream, Group: rep.Group, Start: "-", End: "+", Count: oldest}).Result()
			if err != nil {
				return nil, fmt.Errorf("xpending %s %s: %w", rep.Stream, rep.Group, err)
			}
			for _, e := range ext {
				rep.Oldest = append(rep.Oldest, pendingEntryInfo{ID: e.ID, Consumer: e.Consumer, AgeMS: entryAge(e.ID).Milliseconds(), IdleMS: e.Idle.Milliseconds(), Deliveries: e.RetryCount})
			}
		}
	}
	if a.cfg.DLQStreamKey != "" {
		n, err := rdb.XLen(ctx, a.cfg.DLQStreamKey).Result()
		if err != nil {
			return nil, fmt.Errorf("xlen %s: %w", a.cfg.DLQStreamKey, err)
		}
		rep.DLQ = &streamLength{Stream: a.cfg.DLQStreamKey, Length: n}
	}
	ob, err := outbox.ReadStats(ctx, pool)
	if err != nil {
		return nil, err
	}
	rep.Outbox.Backlog, rep.Outbox.Scheduled, rep.Outbox.Dead = ob.Due, ob.Scheduled, ob.Dead
	rep.Outbox.OldestAgeMS = ob.OldestDue.Milliseconds()
	store, err := task.NewStore(a.storeConfig(), pool)
	if err != nil {
		return nil, usageErr(err)
	}
	counts, err := store.CountByStatus(ctx)
	if err != nil {
		return nil, err
	}
	for s, n := range counts {
		rep.Tasks[string(s)] = n
	}
	return rep, nil
}

// entryAge is the time since a stream entry id's millisecond timestamp.
func entryAge(id string) time.Duration {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return 0
	}
	return time.Since(time.UnixMilli(n))
}

func (a *app) printPending(r *pendingReport) {
	a.printf("STREAM %s: %d entries", r.Stream, r.StreamLength)
	if !r.GroupExists {
		a.printf("; group %s does not exist yet ('run' creates it)\n", r.Group)
	} else {
		a.printf("; group %s: last delivered %s", r.Group, r.LastDeliveredID)
		if r.Lag != nil {
			a.printf(", %d not yet delivered", *r.Lag)
		}
		a.printf("\n")
	}
	a.printf("\nPENDING (delivered, not acknowledged): %d\n", r.Pending)
	if len(r.Consumers) > 0 {
		rows := make([][]string, len(r.Consumers))
		for i, c := range r.Consumers {
			rows[i] = []string{c.Name, fmt.Sprint(c.Pending), humantime.Duration(time.Duration(c.IdleMS) * time.Millisecond)}
		}
		a.table([]string{"CONSUMER", "PENDING", "IDLE"}, rows)
	}
	if len(r.Oldest) > 0 {
		a.printf("\nOLDEST PENDING ENTRIES\n")
		rows := make([][]string, len(r.Oldest))
		for i, e := range r.Oldest {
			rows[i] = []string{e.ID, e.Consumer, humantime.Duration(time.Duration(e.AgeMS) * time.Millisecond), humantime.Duration(time.Duration(e.IdleMS) * time.Millisecond), fmt.Sprint(e.Deliveries)}
		}
		a.table([]string{"ENTRY", "CONSUMER", "AGE", "IDLE", "DELIVERIES"}, rows)
	}
	if len(r.PriorityStreams) > 0 {
		a.printf("\nPRIORITY STREAMS (priority 2, the default, is %s above)\n", r.Stream)
		rows := make([][]string, len(r.PriorityStreams))
		for i, ps := range r.PriorityStreams {
			rows[i] = []string{fmt.Sprint(ps.Priority), ps.Stream, fmt.Sprint(ps.Length), fmt.Sprint(ps.Pending)}
		}
		a.table([]string{"PRIORITY", "STREAM", "ENTRIES", "PENDING"}, rows)
	}
	if r.DLQ != nil {
		a.printf("\nDLQ %s: %d entries\n", r.DLQ.Stream, r.DLQ.Length)
	}
	a.printf("\nOUTBOX: %d event(s) due, waiting to be published", r.Outbox.Backlog)
	if r.Outbox.Backlog > 0 {
		a.printf(" (oldest %s)", humantime.Duration(time.Duration(r.Outbox.OldestAgeMS)*time.Millisecond))
	}
	a.printf(", %d scheduled (delayed, not yet due), %d DEAD\n", r.Outbox.Scheduled, r.Outbox.Dead)
	a.printf("\nTASKS\n")
	rows := make([][]string, 0, len(task.States))
	for _, s := range task.States {
		rows = append(rows, []string{string(s), fmt.Sprint(r.Tasks[string(s)])})
	}
	a.table([]string{"STATUS", "COUNT"}, rows)
}
