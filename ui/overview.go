package ui

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Overview limits. Counting a large table by status on every poll would
// read it all; the overview counts at most CountCap rows per status,
// exactly below the cap, and shows the planner's estimate
// (pg_class.reltuples times the status's frequency in pg_stats) above it.
// The unfinished states are counted together, exactly and by kind, in one
// walk of the unfinished tasks while there are fewer than 3 × CountCap of them
// (task.LiveCounts: each walk reads the last minute's tasks, so one walk
// instead of one per state and query); past that, and for DEAD and
// CANCELLED, the kinds of the newest KindCap tasks of each status are
// counted (their rows are read for the kind); succeeded tasks per kind
// come from the audit samples. The whole overview is cached
// for overviewTTL, so any number of open dashboards cost one set of
// queries per interval.
const (
	CountCap    = 5000
	KindCap     = 1000
	overviewTTL = 1500 * time.Millisecond
	redisWait   = time.Second
)

// statusCount is one status on the overview.
type statusCount struct {
	State task.State
	N     int64
	// Capped: at least N (the exact count stopped at CountCap);
	// Estimate is the planner's estimate then (0 when unknown).
	Capped   bool
	Estimate int64
}

// kindRow is one kind on the overview: its tasks among the counted ones,
// its recent throughput, its settings.
type kindRow struct {
	Kind                      string
	Waiting, Running          int64
	Dead, Cancelled           int64
	Succeeded15, Failed15     int64
	Paused                    bool
	Concurrency               int
	Rate                      string
	Limited                   bool
	WaitingCapped, DeadCapped bool
}

type consumerRow struct {
	Name    string
	Pending int64
	Idle    time.Duration
}

type leaderRow struct {
	Name, ID  string
	ElectedAt time.Time
	ExpiresAt time.Time
}

// redisView is the Redis side of the overview.
type redisView struct {
	Stream, Group, DLQKey string
	Length                int64
	GroupExists           bool
	Pending               int64
	Lag                   int64
	LagKnown              bool
	DLQ                   int64
	// Priorities are the streams of priorities 1, 3 and 4 (the default,
	// 2, is Stream).
	Priorities []priorityRow
	Consumers  []consumerRow
	Err        string
}

// priorityRow is a priority stream's length and the group's pending
// count there.
type priorityRow struct {
	Priority        int
	Stream          string
	Length, Pending int64
}

type overviewData struct {
	At         time.Time
	Statuses   []statusCount
	Total      int64
	Kinds      []kindRow
	Redis      *redisView
	Backlog    int64
	BacklogDue int64 // of Backlog, due (the rest are delayed tasks' rows not yet due; see outbox.Backlog)
	BacklogC   bool  // capped
	OldestDue  time.Duration
	Leaders    []leaderRow
	Retention  []retentionRow // the retention windows (Config.Retention); nil: unknown
	Series     series
	Took       time.Duration
	Errors     []string
}

// retentionRow is a terminal state's retention window; Forever: kept
// forever.
type retentionRow struct {
	State   task.State
	Window  time.Duration
	Forever bool
}

// retentionRows lists the windows of w; nil when w is unset.
func retentionRows(w task.Windows) []retentionRow {
	if w == (task.Windows{}) {
		return nil
	}
	var rows []retentionRow
	for _, r := range []struct {
		st task.State
		d  time.Duration
	}{{task.Succeeded, w.Succeeded}, {task.Cancelled, w.Cancelled}, {task.Dead, w.Dead}} {
		rows = append(rows, retentionRow{State: r.st, Window: r.d, Forever: r.d <= 0})
	}
	return rows
}

// overviewCache keeps the last overview for overviewTTL.
type overviewCache struct {
	mu   sync.Mutex
	last *overviewData
}

// forget drops the cached overview.
func (c *overviewCache) forget() {
	c.mu.Lock()
	c.last = nil
	c.mu.Unlock()
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request, v *view) {
	d, err := h.cachedOverview(r.Context())
	if err != nil {
		h.internal(w, r, err)
		return
	}
	v.Title, v.Nav, v.Live, v.D = "Overview", "overview", Prefix+"?live=1", d
	h.render(w, r, http.StatusOK, "overview", v)
}

// cachedOverview returns the overview's data, from the cache when it is
// fresher than overviewTTL.
func (h *Handler) cachedOverview(ctx context.Context) (*overviewData, error) {
	c := h.stats
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil && time.Since(c.last.At) < overviewTTL {
		return c.last, nil
	}
	d, err := h.readOverview(ctx)
	if err != nil {
		return nil, err
	}
	c.last = d
	return d, nil
}

// estimateSQL is the planner's estimate of the tasks per status.
const estimateSQL = `
SELECT u.v, (u.f * greatest(c.reltuples, 0))::bigint
FROM pg_class c, pg_stats s,
     unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS u(v, f)
WHERE c.oid = 'ingest_task'::regclass AND s.schemaname = current_schema()
  AND s.tablename = 'ingest_task' AND s.attname = 'status'`

const leaderSQL = `SELECT name, leader_id, elected_at, expires_at FROM ingest_leader WHERE expires_at > now() ORDER BY name`

const kindSettingsSQL = `
SELECT kind, paused, concurrency, rate_count, rate_period_ms FROM ingest_kind
WHERE paused OR concurrency > 0 OR rate_count > 0 ORDER BY kind`

func (h *Handler) readOverview(ctx context.Context) (*overviewData, error) {
	begun := time.Now()
	d := &overviewData{At: begun, Retention: retentionRows(h.cfg.Retention)}
	var mu sync.Mutex
	softErr := func(what string, err error) {
		mu.Lock()
		d.Errors = append(d.Errors, h.problem(ctx, what, err))
		mu.Unlock()
	}
	kinds := map[string]*kindRow{}
	kind := func(name string) *kindRow {
		k := kinds[name]
		if k == nil {
			k = &kindRow{Kind: name}
			kinds[name] = k
		}
		return k
	}
	var (
		counts    = map[task.State]int64{}
		estimates = map[task.State]int64{}
		perKind   = map[string]map[task.State]int64{}
		settings  []kindRow
	)
	g, gctx := errgroup.WithContext(ctx)
	// The unfinished states are counted in one walk (task.LiveCounts)
	// while there are fewer than h.liveCap unfinished tasks, exactly and by
	// kind; the others (and, past liveCap, each unfinished state apart)
	// with a capped count per state and the kinds of their newest KindCap.
	var live, ended, failed []task.State
	for _, s := range task.States {
		switch {
		case !s.Terminal():
			live = append(live, s)
		case s != task.Succeeded:
			ended, failed = append(ended, s), append(failed, s)
		default:
			ended = append(ended, s)
		}
	}
	var (
		liveCounts   map[task.State]int64
		liveByKind   map[string]map[task.State]int64
		liveComplete bool
		endedByKind  map[string]map[task.State]int64
	)
	g.Go(func() error {
		var err error
		liveCounts, liveByKind, liveComplete, err = task.LiveCounts(gctx, h.cfg.DB, h.liveCap)
		return err
	})
	g.Go(func() error {
		c, err := task.CappedCounts(gctx, h.cfg.DB, ended, CountCap)
		counts = c
		return err
	})
	g.Go(func() error {
		k, err := task.NewestByKind(gctx, h.cfg.DB, failed, KindCap)
		endedByKind = k
		return err
	})
	g.Go(func() error {
		rows, err := h.cfg.DB.Query(gctx, estimateSQL)
		if err != nil {
			softErr("estimates", err)
			return nil
		}
		var st string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { estimates[task.State(st)] = n; return nil }); err != nil {
			softErr("estimates", err)
		}
		return nil
	})
	g.Go(func() error {
		// Up to CountCap+1 unsent rows in due order on the claim index.
		b, err := outbox.ReadBacklog(gctx, h.cfg.DB, CountCap+1)
		if err != nil {
			return err
		}
		d.Backlog, d.BacklogDue, d.OldestDue = b.Due+b.Scheduled, b.Due, b.OldestDue
		if d.Backlog > CountCap {
			d.Backlog, d.BacklogC = CountCap, true
			d.BacklogDue = min(d.BacklogDue, CountCap)
		}
		return nil
	})
	g.Go(func() error {
		rows, err := h.cfg.DB.Query(gctx, leaderSQL)
		if err != nil {
			return fmt.Errorf("leader: %w", err)
		}
		d.Leaders, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (leaderRow, error) {
			var l leaderRow
			return l, r.Scan(&l.Name, &l.ID, &l.ElectedAt, &l.ExpiresAt)
		})
		if err != nil {
			return fmt.Errorf("leader: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		rows, err := h.cfg.DB.Query(gctx, kindSettingsSQL)
		if err != nil {
			return fmt.Errorf("kind settings: %w", err)
		}
		settings, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (kindRow, error) {
			var k kindRow
			var rate task.Rate
			var periodMS int64
			err := r.Scan(&k.Kind, &k.Paused, &k.Concurrency, &rate.Count, &periodMS)
			rate.Per = time.Duration(periodMS) * time.Millisecond
			k.Rate = rate.String()
			k.Limited = k.Concurrency > 0 || rate.Count > 0
			return k, err
		})
		if err != nil {
			return fmt.Errorf("kind settings: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		s, err := h.samp.Series(gctx)
		if err != nil {
			softErr("audit samples", err)
		}
		d.Series = s
		return nil
	})
	if h.cfg.Redis != nil {
		g.Go(func() error {
			d.Redis = h.readRedis(gctx)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if !liveComplete {
		c, err := task.CappedCounts(ctx, h.cfg.DB, live, CountCap)
		if err != nil {
			return nil, err
		}
		if liveByKind, err = task.NewestByKind(ctx, h.cfg.DB, live, KindCap); err != nil {
			return nil, err
		}
		liveCounts = c
	}
	for s, n := range liveCounts {
		counts[s] = n
	}
	for _, m := range []map[string]map[task.State]int64{liveByKind, endedByKind} {
		for k, byState := range m {
			if perKind[k] == nil {
				perKind[k] = map[task.State]int64{}
			}
			maps.Copy(perKind[k], byState)
		}
	}
	for _, s := range task.States {
		sc := statusCount{State: s, N: counts[s], Capped: counts[s] >= CountCap}
		if sc.Capped {
			sc.Estimate = max(estimates[s], sc.N)
			d.Total += sc.Estimate
		} else {
			d.Total += sc.N
		}
		d.Statuses = append(d.Statuses, sc)
	}
	for name, byState := range perKind {
		k := kind(name)
		k.Waiting = byState[task.Queued] + byState[task.Retrying]
		k.Running = byState[task.Running]
		k.Dead, k.Cancelled = byState[task.Dead], byState[task.Cancelled]
		k.WaitingCapped = !liveComplete && (counts[task.Queued] >= KindCap || counts[task.Retrying] >= KindCap)
		k.DeadCapped = counts[task.Dead] >= KindCap
	}
	for name, t := range d.Series.ByKind {
		k := kind(name)
		k.Succeeded15, k.Failed15 = t.Succeeded, t.Retried+t.Dead
	}
	for _, s := range settings {
		k := kind(s.Kind)
		k.Paused, k.Concurrency, k.Rate, k.Limited = s.Paused, s.Concurrency, s.Rate, s.Limited
	}
	for _, k := range kinds {
		d.Kinds = append(d.Kinds, *k)
	}
	sort.Slice(d.Kinds, func(i, j int) bool { return d.Kinds[i].Kind < d.Kinds[j].Kind })
	d.Took = time.Since(begun)
	return d, nil
}

// readRedis reads the stream, its group, consumers and the DLQ depth.
func (h *Handler) readRedis(ctx context.Context) *redisView {
	ctx, cancel := context.WithTimeout(ctx, redisWait)
	defer cancel()
	rv := &redisView{Stream: h.cfg.Stream, Group: h.cfg.Group, DLQKey: h.cfg.DLQKey}
	rdb := h.cfg.Redis
	var err error
	defer func() {
		if err != nil {
			rv.Err = h.problem(ctx, "Redis", err)
		}
	}()
	if rv.Length, err = rdb.XLen(ctx, rv.Stream).Result(); err != nil {
		return rv
	}
	if h.cfg.DLQKey != "" {
		if rv.DLQ, err = rdb.XLen(ctx, h.cfg.DLQKey).Result(); err != nil {
			return rv
		}
	}
	if g, gerr := stream.NewGroup(stream.Config{Stream: rv.Stream, Group: rv.Group, Consumer: "ui"}, rdb); gerr == nil {
		for _, p := range stream.Priorities {
			if p == stream.DefaultPriority {
				continue
			}
			row := priorityRow{Priority: p, Stream: stream.Key(rv.Stream, p)}
			if row.Length, row.Pending, err = g.StatsOf(ctx, row.Stream); err != nil {
				return rv
			}
			rv.Priorities = append(rv.Priorities, row)
		}
	}
	groups, gerr := rdb.XInfoGroups(ctx, rv.Stream).Result()
	if gerr != nil {
		if !stream.IsMissing(gerr) {
			err = gerr
		}
		return rv
	}
	for _, g := range groups {
		if g.Name == rv.Group {
			rv.GroupExists, rv.Pending = true, g.Pending
			if g.Lag == 0 || (g.Lag > 0 && g.EntriesRead > 0) {
				rv.Lag, rv.LagKnown = g.Lag, true
			}
		}
	}
	if !rv.GroupExists {
		return rv
	}
	cs, cerr := rdb.XInfoConsumers(ctx, rv.Stream, rv.Group).Result()
	if cerr != nil {
		err = cerr
		return rv
	}
	for _, c := range cs {
		rv.Consumers = append(rv.Consumers, consumerRow{Name: c.Name, Pending: c.Pending, Idle: c.Idle})
	}
	slices.SortFunc(rv.Consumers, func(a, b consumerRow) int {
		if a.Pending != b.Pending {
			return int(b.Pending - a.Pending)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return rv
}
