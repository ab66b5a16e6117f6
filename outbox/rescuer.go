package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/defaults"
)

// Rescuer defaults.
const (
	DefaultRescueInterval    = 30 * time.Second
	DefaultRescueBatchSize   = 100
	DefaultRescuePagesPerRun = 10
	DefaultRescueGrace       = time.Minute
	componentRescuer         = "rescuer"
)

// RescuerConfig configures a Rescuer. Zero fields take the Default* values.
type RescuerConfig struct {
	// Stream is where a task that has no outbox row at all is republished
	// (INGEST_REDIS_STREAM_KEY). Other tasks go back to the stream of their
	// latest outbox row.
	Stream string
	// Group is the consumer group whose delivery state tells whether an
	// entry is still on its way to a worker (INGEST_REDIS_GROUP).
	Group string
	// Interval is the period of Run's passes.
	Interval time.Duration
	// BatchSize is how many candidate tasks one page examines: one indexed
	// query and one pipelined Redis round trip.
	BatchSize int
	// PagesPerRun bounds the pages one pass examines per kind of candidate
	// (QUEUED, RETRYING, RUNNING with an expired lease). The pass goes on
	// where the previous one stopped (keyset), and starts over at the end.
	PagesPerRun int
	// Grace is how long after its latest outbox row was SENT a task is left
	// alone, so the rescuer never races a fresh publish or delivery.
	Grace time.Duration
}

func (c *RescuerConfig) setDefaults() {
	defaults.Set(&c.Stream, DefaultStream)
	defaults.Set(&c.Group, DefaultGroup)
	defaults.Set(&c.Interval, DefaultRescueInterval)
	defaults.Set(&c.BatchSize, DefaultRescueBatchSize)
	defaults.Set(&c.PagesPerRun, DefaultRescuePagesPerRun)
	defaults.Set(&c.Grace, DefaultRescueGrace)
}

// Validate checks the configuration (zero fields taking their defaults)
// and names the bad field.
func (c RescuerConfig) Validate() error {
	c.setDefaults()
	bad := func(format string, args ...any) error { return configErr(componentRescuer, format, args...) }
	switch {
	case c.Interval < time.Millisecond:
		return bad("Interval must be >= 1ms, got %s", c.Interval)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return bad("BatchSize must be in [1, 10000], got %d", c.BatchSize)
	case c.PagesPerRun < 1:
		return bad("PagesPerRun must be >= 1, got %d", c.PagesPerRun)
	case c.Grace < 0:
		return bad("Grace must be >= 0, got %s", c.Grace)
	}
	return nil
}

// RescueResult counts what one rescuer pass did.
type RescueResult struct {
	// Examined candidate tasks (QUEUED, RETRYING, RUNNING with an expired
	// lease).
	Examined int
	// Missing: eligible tasks whose entry is not in Redis.
	Missing int
	// Rescued: tasks given a new outbox row (Missing minus those that
	// changed meanwhile).
	Rescued int
}

// Rescuer finds tasks that should be in Redis but are not, and gives each
// a new outbox row. A candidate is a QUEUED or due RETRYING task, or a
// RUNNING task whose lease expired, that has no unsent outbox row and whose
// latest row was SENT more than Grace ago (or that has no outbox row at
// all). It is missing when that row's stream entry is gone (XRANGE id id is
// empty, the stream or the group does not exist) or was delivered and is no
// longer pending (acknowledged, or its PEL lost).
//
// A task whose latest outbox row is DEAD (the relay gave up, e.g. during a
// long Redis outage) is rescued too once that row is older than Grace: Redis
// must catch up with Postgres without an operator. The DEAD row stays for
// forensics; while the stream keeps failing, each task gains at most one
// DEAD row per full relay retry cycle.
//
// Several rescuers may run at once (each rescue re-checks the task under
// its row lock); the passes of one Rescuer run one at a time.
type Rescuer struct {
	cfg     RescuerConfig
	pool    *pgxpool.Pool
	rdb     redis.UniversalClient
	logger  *slog.Logger
	metrics *maintenanceMetrics
	cursors [len(rescueClasses)]rescueCursor
}

type rescueCursor struct {
	at time.Time
	id uuid.UUID
}

// NewRescuer returns a rescuer. Its metrics are registered on reg (nil:
// none).
func NewRescuer(cfg RescuerConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Rescuer, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil || rdb == nil {
		return nil, configErr(componentRescuer, "a Postgres pool and a Redis client are required")
	}
	m, err := newMaintenanceMetrics(reg)
	if err != nil {
		return nil, err
	}
	logger = discardIfNil(logger).With("component", "outbox-rescuer", "stream", cfg.Stream, "group", cfg.Group)
	return &Rescuer{cfg: cfg, pool: pool, rdb: rdb, logger: logger, metrics: m}, nil
}

// Run runs a pass every Interval until ctx is cancelled, then returns nil.
func (r *Rescuer) Run(ctx context.Context) error {
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	for {
		res, err := r.runOnce(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.metrics.failures.WithLabelValues(componentRescuer).Inc()
			r.logger.Error("outbox rescue pass failed", "err", err)
		case res.Missing > 0:
			r.logger.Info("rescued tasks missing from Redis", "examined", res.Examined,
				"missing", res.Missing, "rescued", res.Rescued)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// rescueColumns and rescueFrom are shared by the candidate queries: each
// task with its latest outbox row and whether it is eligible (due, no
// unsent row, latest row SENT (or DEAD) more than $4 ms ago, or no row at all).
// $1, $2: keyset cursor; $3: page size; $4: grace in ms.
//
// The lateral reads a task's outbox rows through outbox_event_task_idx only:
// the latest row and, as a window count over all of them, the unsent ones.
// A separate "count unsent rows of this task" subquery let the planner
// pick the claim index (unsent rows, any task) and filter it on task_id,
// which is O(unsent rows) per candidate, and while a backlog is relayed
// that index is large and full of dead entries: one page took 6.6 s.
const rescueColumns = `
SELECT t.id, t.status, coalesce(lo.id, 0), coalesce(lo.stream, ''), coalesce(lo.stream_id, ''),
    (t.status = 'RUNNING' OR t.next_retry_at IS NULL OR t.next_retry_at <= now())
    AND coalesce(lo.unsent, 0) = 0
    AND CASE WHEN lo.id IS NULL THEN t.updated_at < now() - $4 * interval '1 millisecond'
             WHEN lo.status = 'DEAD' THEN lo.created_at < now() - $4 * interval '1 millisecond'
             ELSE lo.status = 'SENT' AND lo.sent_at < now() - $4 * interval '1 millisecond' END`

const rescueFrom = `
FROM ingest_task t
LEFT JOIN LATERAL (
    SELECT o.id, o.status, o.stream, o.stream_id, o.sent_at, o.created_at,
           count(*) FILTER (WHERE o.status IN ('NEW', 'RETRYING')) OVER () AS unsent
    FROM outbox_event o
    WHERE o.task_id = t.id ORDER BY o.id DESC LIMIT 1
) lo ON true`

// rescueQueuedSQL pages QUEUED tasks on (status, created_at, id).
const rescueQueuedSQL = rescueColumns + `, t.created_at` + rescueFrom + `
WHERE t.status = 'QUEUED' AND (t.created_at, t.id) > ($1, $2)
ORDER BY t.created_at, t.id LIMIT $3`

// rescueRetryingSQL pages RETRYING tasks on (status, created_at, id); those
// not yet due come back ineligible, so a page stays O(page size).
const rescueRetryingSQL = rescueColumns + `, t.created_at` + rescueFrom + `
WHERE t.status = 'RETRYING' AND (t.created_at, t.id) > ($1, $2)
ORDER BY t.created_at, t.id LIMIT $3`

// rescueRunningSQL pages RUNNING tasks whose lease expired on the partial
// lease index.
const rescueRunningSQL = rescueColumns + `, t.lease_until` + rescueFrom + `
WHERE t.status = 'RUNNING' AND t.lease_until < now() AND (t.lease_until, t.id) > ($1, $2)
ORDER BY t.lease_until, t.id LIMIT $3`

var rescueClasses = [...]string{rescueQueuedSQL, rescueRetryingSQL, rescueRunningSQL}

// candidate is one examined task.
type candidate struct {
	id       uuid.UUID
	status   string
	lastID   int64 // latest outbox row (0: none)
	stream   string
	streamID string
	eligible bool
	key      time.Time
}

// runOnce examines up to PagesPerRun pages of each kind of candidate.
func (r *Rescuer) runOnce(ctx context.Context) (RescueResult, error) {
	var res RescueResult
	for class := range rescueClasses {
		for range r.cfg.PagesPerRun {
			n, err := r.page(ctx, class, &res)
			if err != nil {
				return res, err
			}
			if n < r.cfg.BatchSize {
				r.cursors[class] = rescueCursor{} // start over next pass
				break
			}
		}
	}
	r.metrics.rescued.Add(float64(res.Rescued))
	return res, nil
}

// page examines one page of candidates of a class and rescues the missing
// ones; it returns the page's length.
func (r *Rescuer) page(ctx context.Context, class int, res *RescueResult) (int, error) {
	cur := r.cursors[class]
	rows, err := r.pool.Query(ctx, rescueClasses[class], cur.at, cur.id, r.cfg.BatchSize, r.cfg.Grace.Milliseconds())
	if err != nil {
		return 0, fmt.Errorf("find rescue candidates: %w", err)
	}
	cands, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (candidate, error) {
		var c candidate
		err := cr.Scan(&c.id, &c.status, &c.lastID, &c.stream, &c.streamID, &c.eligible, &c.key)
		return c, err
	})
	if err != nil {
		return 0, fmt.Errorf("find rescue candidates: %w", err)
	}
	if len(cands) == 0 {
		return 0, nil
	}
	last := cands[len(cands)-1]
	r.cursors[class] = rescueCursor{at: last.key, id: last.id}
	res.Examined += len(cands)

	byStream := map[string][]candidate{}
	for _, c := range cands {
		if !c.eligible {
			continue
		}
		if c.lastID == 0 {
			c.stream = r.cfg.Stream
		}
		byStream[c.stream] = append(byStream[c.stream], c)
	}
	for stream, cs := range byStream {
		missing, err := r.missing(ctx, stream, cs)
		if err != nil {
			return 0, err
		}
		res.Missing += len(missing)
		n, err := r.rescue(ctx, stream, missing)
		if err != nil {
			return 0, err
		}
		res.Rescued += n
	}
	return len(cands), nil
}

// missing returns the candidates (of one stream) whose entry is not on its
// way to a worker of the group. The group's last-delivered-id is read
// before the entries, so an entry delivered meanwhile still counts as
// undelivered (present).
func (r *Rescuer) missing(ctx context.Context, stream string, cs []candidate) ([]candidate, error) {
	var check []candidate
	var missing []candidate
	for _, c := range cs {
		if c.lastID == 0 || c.streamID == "" {
			missing = append(missing, c)
		} else {
			check = append(check, c)
		}
	}
	if len(check) == 0 {
		return missing, nil
	}
	groups, err := r.rdb.XInfoGroups(ctx, stream).Result()
	if isNoSuchKey(err) {
		return append(missing, check...), nil
	}
	if err != nil {
		return nil, fmt.Errorf("xinfo groups %s: %w", stream, err)
	}
	var lastDelivered streamID
	found := false
	for _, g := range groups {
		if g.Name == r.cfg.Group {
			found = true
			if lastDelivered, err = parseStreamID(g.LastDeliveredID); err != nil {
				return nil, fmt.Errorf("xinfo groups %s: %w", stream, err)
			}
		}
	}
	if !found {
		return append(missing, check...), nil
	}

	ids := make([]streamID, len(check))
	ranges := make([]*redis.XMessageSliceCmd, len(check))
	pendings := make([]*redis.XPendingExtCmd, len(check))
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range check {
			id, err := parseStreamID(c.streamID)
			if err != nil {
				continue // not an entry id: treat as gone
			}
			ids[i] = id
			ranges[i] = p.XRangeN(ctx, stream, c.streamID, c.streamID, 1)
			if !lastDelivered.less(id) {
				pendings[i] = p.XPendingExt(ctx, &redis.XPendingExtArgs{
					Stream: stream, Group: r.cfg.Group, Start: c.streamID, End: c.streamID, Count: 1,
				})
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("xrange/xpending %s: %w", stream, err)
	}
	for i, c := range check {
		if ranges[i] == nil || len(ranges[i].Val()) == 0 {
			missing = append(missing, c) // trimmed, deleted, or lost with the stream
			continue
		}
		if lastDelivered.less(ids[i]) {
			continue // not yet delivered to the group
		}
		if len(pendings[i].Val()) == 0 {
			missing = append(missing, c) // delivered and no longer pending
		}
	}
	return missing, nil
}

func isNoSuchKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}

// lockTasksSQL locks the candidate tasks in id order (the order the task
// store locks in), so the re-check below reads their committed state.
const lockTasksSQL = `SELECT id FROM ingest_task WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE`

// stillMissingSQL re-checks, under the row locks, that each candidate is
// still a candidate and that no outbox row was added since it was examined
// (its latest row is still $2).
const stillMissingSQL = `
SELECT t.id FROM ingest_task t
JOIN unnest($1::uuid[], $2::bigint[]) AS c(id, last_id) ON c.id = t.id
WHERE ((t.status IN ('QUEUED', 'RETRYING') AND (t.next_retry_at IS NULL OR t.next_retry_at <= now()))
       OR (t.status = 'RUNNING' AND t.lease_until < now()))
  AND coalesce((SELECT max(o.id) FROM outbox_event o WHERE o.task_id = t.id), 0) = c.last_id`

// rescue writes a new outbox row to stream for each missing task that is
// still a candidate, in one transaction, and returns how many.
func (r *Rescuer) rescue(ctx context.Context, stream string, cs []candidate) (int, error) {
	if len(cs) == 0 {
		return 0, nil
	}
	ids := make([]uuid.UUID, len(cs))
	lastIDs := make([]int64, len(cs))
	for i, c := range cs {
		ids[i], lastIDs[i] = c.id, c.lastID
	}
	var n int
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockTasksSQL, ids); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, stillMissingSQL, ids, lastIDs)
		if err != nil {
			return err
		}
		still, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		if err != nil {
			return err
		}
		n = len(still)
		return Insert(ctx, tx, stream, still...)
	})
	if err != nil {
		return 0, fmt.Errorf("rescue %d tasks to %s: %w", len(cs), stream, err)
	}
	return n, nil
}
