package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/defaults"
)

// Retention defaults.
const (
	DefaultRetentionAge           = 24 * time.Hour
	DefaultRetentionInterval      = time.Minute
	DefaultRetentionBatchSize     = 1000
	DefaultRetentionBatchesPerRun = 10
	componentRetention            = "retention"
)

// RetentionConfig configures a Retention. Zero fields take the Default*
// values.
type RetentionConfig struct {
	// Age: SENT outbox rows whose sent_at is older are deleted.
	Age time.Duration
	// Interval is the period of Run's passes.
	Interval time.Duration
	// BatchSize is how many rows one DELETE removes; each is its own
	// short transaction.
	BatchSize int
	// BatchesPerRun bounds the DELETEs of one pass.
	BatchesPerRun int
	// Streams are the task streams to trim (default: DefaultStream).
	Streams []string
	// DisableTrim leaves the streams alone (rows are still deleted).
	DisableTrim bool
}

func (c *RetentionConfig) setDefaults() {
	defaults.Set(&c.Age, DefaultRetentionAge)
	defaults.Set(&c.Interval, DefaultRetentionInterval)
	defaults.Set(&c.BatchSize, DefaultRetentionBatchSize)
	defaults.Set(&c.BatchesPerRun, DefaultRetentionBatchesPerRun)
	if len(c.Streams) == 0 {
		c.Streams = []string{DefaultStream}
	}
}

// Validate checks the configuration (zero fields taking their defaults)
// and names the bad field.
func (c RetentionConfig) Validate() error {
	c.setDefaults()
	bad := func(format string, args ...any) error {
		return configErr(componentRetention, format, args...)
	}
	switch {
	case c.Age < time.Millisecond:
		return bad("Age must be >= 1ms, got %s", c.Age)
	case c.Interval < time.Millisecond:
		return bad("Interval must be >= 1ms, got %s", c.Interval)
	case c.BatchSize < 1 || c.BatchSize > 100000:
		return bad("BatchSize must be in [1, 100000], got %d", c.BatchSize)
	case c.BatchesPerRun < 1:
		return bad("BatchesPerRun must be >= 1, got %d", c.BatchesPerRun)
	}
	for i, s := range c.Streams {
		if s == "" {
			return bad("Streams[%d] is empty", i)
		}
	}
	return nil
}

// RetentionResult counts what one retention pass did.
type RetentionResult struct {
	// Deleted SENT outbox rows.
	Deleted int
	// Trimmed stream entries, over all streams.
	Trimmed int64
}

// Retention deletes old SENT outbox rows and trims the task streams.
//
// A SENT row is deleted once older than Age, unless it is the latest
// outbox row of a task that is not finished: the rescuer needs that row's
// stream_id to tell whether the task's entry is still in Redis. DEAD rows
// are kept.
//
// A stream is trimmed (XTRIM MINID) below the oldest entry any consumer
// group still needs: the smallest pending id (XPENDING summary) and the
// first entry after the group's last-delivered-id, the minimum over all
// groups. A stream without groups is not trimmed.
type Retention struct {
	cfg     RetentionConfig
	pool    *pgxpool.Pool
	rdb     redis.UniversalClient
	logger  *slog.Logger
	metrics *maintenanceMetrics
}

// NewRetention returns a retention. Its metrics are registered on reg
// (nil: none).
func NewRetention(cfg RetentionConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, logger *slog.Logger, reg prometheus.Registerer) (*Retention, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if pool == nil || (rdb == nil && !cfg.DisableTrim) {
		return nil, configErr(componentRetention, "a Postgres pool and (unless DisableTrim) a Redis client are required")
	}
	m, err := newMaintenanceMetrics(reg)
	if err != nil {
		return nil, err
	}
	logger = discardIfNil(logger).With("component", "outbox-retention")
	return &Retention{cfg: cfg, pool: pool, rdb: rdb, logger: logger, metrics: m}, nil
}

// Run runs a pass every Interval until ctx is cancelled, then returns nil.
func (r *Retention) Run(ctx context.Context) error {
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	for {
		res, err := r.runOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.metrics.failures.WithLabelValues(componentRetention).Inc()
			r.logger.Error("outbox retention pass failed", "err", err)
		}
		if res.Deleted > 0 || res.Trimmed > 0 {
			r.logger.Debug("outbox retention pass", "deleted", res.Deleted, "trimmed", res.Trimmed)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// runOnce deletes old rows and trims every stream; a failure of one part
// does not stop the others.
func (r *Retention) runOnce(ctx context.Context) (RetentionResult, error) {
	var res RetentionResult
	var errs []error
	n, err := r.deleteSent(ctx)
	res.Deleted = n
	errs = append(errs, err)
	if !r.cfg.DisableTrim {
		for _, stream := range r.cfg.Streams {
			n, err := r.trim(ctx, stream)
			res.Trimmed += n
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}

// deleteSentSQL deletes up to $2 SENT rows sent more than $1 ms ago,
// oldest first, except the latest row of an unfinished task.
const deleteSentSQL = `
DELETE FROM outbox_event WHERE id = ANY(ARRAY(
    SELECT o.id FROM outbox_event o
    WHERE o.status = 'SENT' AND o.sent_at < now() - $1 * interval '1 millisecond'
      AND ((SELECT t.status FROM ingest_task t WHERE t.id = o.task_id) IN ('SUCCEEDED', 'DEAD')
           OR EXISTS (SELECT 1 FROM outbox_event n WHERE n.task_id = o.task_id AND n.id > o.id))
    ORDER BY o.sent_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED))`

func (r *Retention) deleteSent(ctx context.Context) (int, error) {
	total := 0
	for range r.cfg.BatchesPerRun {
		tag, err := r.pool.Exec(ctx, deleteSentSQL, r.cfg.Age.Milliseconds(), r.cfg.BatchSize)
		if err != nil {
			return total, fmt.Errorf("delete sent outbox rows: %w", err)
		}
		n := int(tag.RowsAffected())
		total += n
		r.metrics.deleted.Add(float64(n))
		if n < r.cfg.BatchSize {
			break
		}
	}
	return total, nil
}

// trimBound returns the id below which no group of stream needs an entry,
// and false when nothing may be trimmed (no stream, no group, nothing
// delivered). Every group's last-delivered-id is read before any PEL:
// entries delivered in between have greater ids and are kept anyway.
func (r *Retention) trimBound(ctx context.Context, stream string) (streamID, bool, error) {
	groups, err := r.rdb.XInfoGroups(ctx, stream).Result()
	if isNoSuchKey(err) {
		return streamID{}, false, nil
	}
	if err != nil {
		return streamID{}, false, fmt.Errorf("xinfo groups %s: %w", stream, err)
	}
	if len(groups) == 0 {
		return streamID{}, false, nil
	}
	var bound streamID
	for i, g := range groups {
		last, err := parseStreamID(g.LastDeliveredID)
		if err != nil {
			return streamID{}, false, fmt.Errorf("xinfo groups %s: group %s: %w", stream, g.Name, err)
		}
		// Entries after last-delivered-id are undelivered (Lag of them on
		// Redis 7, -1 when Redis cannot tell); ids only grow, so the first
		// of them is at or after last.next().
		if b := last.next(); i == 0 || b.less(bound) {
			bound = b
		}
	}
	pend := make([]*redis.XPendingCmd, len(groups))
	_, err = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, g := range groups {
			pend[i] = p.XPending(ctx, stream, g.Name)
		}
		return nil
	})
	if err != nil {
		return streamID{}, false, fmt.Errorf("xpending %s: %w", stream, err)
	}
	for i, cmd := range pend {
		if cmd.Val().Count == 0 {
			continue
		}
		low, err := parseStreamID(cmd.Val().Lower)
		if err != nil {
			return streamID{}, false, fmt.Errorf("xpending %s %s: %w", stream, groups[i].Name, err)
		}
		if low.less(bound) {
			bound = low
		}
	}
	return bound, streamID{0, 1}.less(bound), nil
}

// trim drops the entries of stream that no group needs any more.
func (r *Retention) trim(ctx context.Context, stream string) (int64, error) {
	bound, ok, err := r.trimBound(ctx, stream)
	if err != nil || !ok {
		return 0, err
	}
	n, err := r.rdb.XTrimMinID(ctx, stream, bound.String()).Result()
	if err != nil {
		return 0, fmt.Errorf("xtrim %s minid %s: %w", stream, bound, err)
	}
	r.metrics.trimmed.WithLabelValues(stream).Add(float64(n))
	return n, nil
}
