package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// retentionResult counts what one retention pass did.
type retentionResult struct {
	// Tasks deleted, by state.
	Tasks map[task.State]int
	// DLQ entries of deleted DEAD tasks removed.
	DLQRemoved int
	// Task-stream entries of deleted tasks removed.
	EntriesRemoved int
	// Trimmed stream entries, over all streams.
	Trimmed int64
}

// retention deletes expired finished tasks and trims the task streams.
//
// A finished task is deleted once its state's window (Tasks) has passed
// since finished_at (its audit and outbox rows go with their partitions:
// partitions.go), in batches of
// BatchSize tasks, one statement each (task.DeleteExpired), until a batch
// is short: a task a
// worker or an operator holds locked is skipped until a later pass, and
// a task that is not finished is never deleted. After each batch has
// committed, the task-stream entries the deleted tasks' outbox rows had
// published are removed (stream.Forget: acknowledged in every group and
// deleted, in one pipeline), so that a reclaimer never claims a pending
// entry of a deleted task and dead-letters it as poison. The DLQ entries
// of the deleted DEAD tasks are removed after the batches have committed
// (dlq.RemoveTasks); an entry whose removal failed stays in the DLQ
// stream, where a redrive of it finds no task. Without a Redis client
// (Kafka mode) only rows are deleted.
//
// A stream is trimmed (XTRIM MINID) below the oldest entry any consumer
// group still needs: the smallest pending id (XPENDING summary) and the
// first entry after the group's last-delivered-id, the minimum over all
// groups. A stream without groups is not trimmed. Every priority's stream
// of a task stream (stream.Keys) is trimmed so.
type retention struct {
	cfg     RetentionConfig
	pool    *pgxpool.Pool
	rdb     redis.UniversalClient
	metrics *metrics
}

func newRetention(cfg RetentionConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, m *metrics) *retention {
	return &retention{cfg: cfg, pool: pool, rdb: rdb, metrics: m}
}

// service is retention as the maintainer runs it.
func (r *retention) service() *service {
	return &service{
		name:     componentRetention,
		interval: r.cfg.Interval,
		msg:      "outbox retention pass",
		level:    slog.LevelDebug,
		pass: func(ctx context.Context) ([]any, error) {
			res, err := r.runOnce(ctx)
			tasks := 0
			for _, n := range res.Tasks {
				tasks += n
			}
			if tasks == 0 && res.Trimmed == 0 {
				return nil, err
			}
			return []any{"tasks_deleted", tasks, "entries_removed", res.EntriesRemoved, "dlq_removed", res.DLQRemoved,
				"trimmed", res.Trimmed}, err
		},
		failed: func() { r.metrics.failures.WithLabelValues(componentRetention).Inc() },
	}
}

// runOnce deletes old rows and trims every stream; a failure of one part
// does not stop the others.
func (r *retention) runOnce(ctx context.Context) (retentionResult, error) {
	var res retentionResult
	var errs []error
	res.Tasks, res.EntriesRemoved, res.DLQRemoved, errs = r.deleteTasks(ctx)
	if !r.cfg.DisableTrim {
		for _, base := range r.cfg.Streams {
			for _, key := range stream.Keys(base) { // every priority's stream
				n, err := r.trim(ctx, key)
				res.Trimmed += n
				errs = append(errs, err)
			}
		}
	}
	return res, errors.Join(errs...)
}

// deleteTasks deletes the expired finished tasks, removing the stream
// entries of each batch after it, then removes the DLQ entries of the
// DEAD ones it deleted. It returns the tasks deleted by state, the stream
// entries and the DLQ entries removed.
func (r *retention) deleteTasks(ctx context.Context) (map[task.State]int, int, int, []error) {
	byState := map[task.State]int{}
	var dead []uuid.UUID
	var errs []error
	forgotten := 0
	// Tasks are deleted until a batch is short: a deployment that
	// finishes more tasks in an Interval than a fixed number of batches
	// hold would otherwise never catch up. Each batch is its own short
	// statement; the loop stops with ctx (the leader stepping down).
	//
	// After a full batch the loop rests as long as the batch took, so
	// that retention uses at most half of one database backend's time and
	// the workers sharing the database keep their throughput while a large
	// backlog of expired tasks is deleted.
	for ctx.Err() == nil {
		begun := time.Now()
		out, err := task.DeleteExpired(ctx, r.pool, r.cfg.Tasks, r.cfg.BatchSize)
		var entries []stream.EntryRef
		for _, d := range out {
			byState[d.Status]++
			r.metrics.tasksDeleted.WithLabelValues(string(d.Status)).Inc()
			if d.Status == task.Dead {
				dead = append(dead, d.ID)
			}
			entries = append(entries, d.Entries...)
		}
		if r.rdb != nil && len(entries) > 0 {
			n, ferr := stream.Forget(context.WithoutCancel(ctx), r.rdb, entries)
			forgotten += n
			if ferr != nil {
				errs = append(errs, fmt.Errorf("remove the stream entries of %d deleted tasks: %w", len(out), ferr))
			}
		}
		if err != nil {
			errs = append(errs, err)
			break
		}
		if len(out) < r.cfg.BatchSize {
			break
		}
		rest := time.NewTimer(time.Since(begun))
		select {
		case <-ctx.Done():
		case <-rest.C:
		}
		rest.Stop()
	}
	removed := 0
	if r.cfg.DLQ != "" && len(dead) > 0 {
		n, err := dlq.RemoveTasks(ctx, r.rdb, r.cfg.DLQ, dead)
		removed = n
		if err != nil {
			errs = append(errs, fmt.Errorf("remove the dlq entries of %d deleted dead tasks: %w", len(dead), err))
		}
	}
	return byState, forgotten, removed, errs
}

// trimBound returns the id below which no group of stream needs an entry,
// and false when nothing may be trimmed (no stream, no group, nothing
// delivered). Every group's last-delivered-id is read before any PEL:
// entries delivered in between have greater ids and are kept anyway.
func (r *retention) trimBound(ctx context.Context, stream string) (streamID, bool, error) {
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
func (r *retention) trim(ctx context.Context, stream string) (int64, error) {
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
