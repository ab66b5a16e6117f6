package maintenance

import (
	"context"
	"errors"
	"log/slog"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/transition"
)

// partitions keeps the audit table's partitions (ingest_task_transition,
// partitioned by RANGE (created_at) since migration 00024): each pass
// creates the partitions that reach Ahead past now (transition.Extend),
// then drops the past partitions that no task still needs, oldest first.
//
// A partition is dropped when all of these hold:
//   - it ended before now (its To is past) and is not the DEFAULT one;
//   - no transaction that began before its end is still open
//     (transition.OpenBefore): an audit row is dated by its transaction's
//     now(), so after that no row can land in it any more;
//   - no task that still exists has a row in it (transition.Blocker, one
//     query, read after the check above so that it sees every row the
//     partition will ever hold). The tasks whose rows it holds have all
//     been deleted: by retention once their window passed, or by an
//     operator. A task whose history spans several partitions keeps every
//     one of them until it is deleted itself, however long it lives.
//
// A partition found held by a task is remembered with that task, and
// while the task exists the partition is not read again (one probe of
// the task's primary key a pass); a new leader reads each once.
//
// Retention (task.DeleteExpired) deletes tasks without their audit rows,
// which go with their partition; so the audit rows of a deleted task stay
// until the last task of their partition is deleted (up to Width plus the
// longest window later). Those rows belong to no task: the listings and
// charts that read audit rows join them to their task and skip them.
type partitions struct {
	cfg     PartitionsConfig
	pool    *pgxpool.Pool
	metrics *metrics
	// held maps a partition to a task that had rows in it when last read.
	held map[string]uuid.UUID
}

func newPartitions(cfg PartitionsConfig, pool *pgxpool.Pool, m *metrics) *partitions {
	return &partitions{cfg: cfg, pool: pool, metrics: m, held: map[string]uuid.UUID{}}
}

// partitionsResult is what one pass did.
type partitionsResult struct {
	Created int
	Dropped []string
	// Held counts the past partitions kept for a task that still exists.
	Held int
}

func (p *partitions) service() *service {
	return &service{
		name:     componentPartitions,
		interval: p.cfg.Interval,
		msg:      "audit partitions pass",
		level:    slog.LevelInfo,
		start:    func() { p.held = map[string]uuid.UUID{} },
		pass: func(ctx context.Context) ([]any, error) {
			res, err := p.runOnce(ctx)
			if res.Created == 0 && len(res.Dropped) == 0 {
				return nil, err
			}
			return []any{"created", res.Created, "dropped", res.Dropped, "held", res.Held}, err
		},
		failed: func() { p.metrics.failures.WithLabelValues(componentPartitions).Inc() },
	}
}

// runOnce creates the partitions ahead and drops those no task needs; a
// failure of the one does not stop the other.
func (p *partitions) runOnce(ctx context.Context) (partitionsResult, error) {
	var res partitionsResult
	n, errCreate := transition.Extend(ctx, p.pool, p.cfg.Width, p.cfg.Ahead, p.cfg.LockTimeout)
	res.Created = n
	errDrop := p.drop(ctx, &res)
	return res, errors.Join(errCreate, errDrop)
}

// drop drops the past partitions that no task needs, oldest first.
func (p *partitions) drop(ctx context.Context, res *partitionsResult) error {
	parts, now, err := transition.Partitions(ctx, p.pool)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	var errs []error
	for _, part := range parts {
		seen[part.Name] = true
		if part.Default || part.To.IsZero() || part.To.After(now) {
			continue
		}
		if id, ok := p.held[part.Name]; ok {
			exists, err := transition.TaskExists(ctx, p.pool, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if exists {
				res.Held++
				continue
			}
			delete(p.held, part.Name)
		}
		open, err := transition.OpenBefore(ctx, p.pool, part.To)
		if err != nil {
			errs = append(errs, err)
			break
		}
		if open {
			break // and so for every later partition
		}
		id, held, err := transition.Blocker(ctx, p.pool, part)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if held {
			p.held[part.Name] = id
			res.Held++
			continue
		}
		if err := transition.DropPartition(ctx, p.pool, part, p.cfg.LockTimeout); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Dropped = append(res.Dropped, part.Name)
	}
	for name := range p.held {
		if !seen[name] {
			delete(p.held, name)
		}
	}
	return errors.Join(errs...)
}
