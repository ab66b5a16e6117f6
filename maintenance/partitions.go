package maintenance

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/partition"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/transition"
)

// The tables partitioned by time and their DEFAULT partitions.
const (
	auditTable    = "ingest_task_transition"
	auditDefault  = "ingest_task_transition_default"
	outboxTable   = "outbox_row" // outbox_event's table (migration 00038)
	outboxDefault = "outbox_event_default"
)

// partitions keeps the partitions of the audit table
// (ingest_task_transition, by RANGE (created_at) since migration 00024)
// and of the outbox (outbox_event, by RANGE (id) since migration 00027).
// Each pass creates the partitions that reach Ahead past now
// (transition.Extend; outbox.Extend, from the rate ids are taken at),
// then drops the past partitions, oldest first. A new partition is never
// attached over rows being written (migrations 00028, 00029): an insert that
// routed its rows before it was there would fail. An audit partition
// begins at least a minute past now; an outbox partition within a
// minute's ids of the last id taken is attached while no outbox row is
// being written (SHARE on the table).
//
// An audit partition is dropped when all of these hold:
//   - it ended before now (its To is past) and is not the DEFAULT one;
//   - no transaction that began before its end is still open
//     (partition.OpenBefore): an audit row is dated by its transaction's
//     now(), so after that no row can land in it any more.
//
// An outbox partition is dropped when all of these hold:
//   - every id of its range has been taken (the sequence's last id is
//     past its end), as seen by an earlier pass, and no transaction that
//     began before that pass is still open: a row takes its id in the
//     transaction that writes it, so after that no row can land in it;
//   - every row in it is SENT or DEAD (outbox.Unfinished): a row still
//     to publish keeps its partition.
//
// Dropping either (partition.Retire) keeps the rows of the tasks that
// still exist: they move into the table's DEFAULT partition, in the
// transaction that drops the partition, so a task's audit trail and
// outbox rows are whole for as long as it exists, however long it lives
// (or with a window that keeps it forever), and no task pins a
// partition. A partition whose rows are still mostly needed (more than
// KeepMax of them belong to tasks that exist: the tasks kept forever,
// say) stays instead, remembered with one of those tasks, and while that
// task exists it is not read again (one probe of the task's primary key a
// pass); a new leader reads each once. After a pass that dropped a
// partition, the DEFAULT partitions lose the kept rows whose task has
// been deleted since (partition.Sweep).
//
// Retention (task.DeleteExpired) deletes tasks without their audit and
// outbox rows, which go with their partition; so the rows of a deleted
// task stay until their partition is dropped (up to Width plus the
// longest window later). Those rows belong to no task: the listings and
// charts that read them join them to their task and skip them.
type partitions struct {
	cfg     PartitionsConfig
	pool    *pgxpool.Pool
	metrics *metrics
	// held maps a partition to a task that had rows in it when last read.
	held map[string]uuid.UUID
	// full maps an outbox partition to when a pass first saw every id of
	// its range taken.
	full map[string]time.Time
}

func newPartitions(cfg PartitionsConfig, pool *pgxpool.Pool, m *metrics) *partitions {
	return &partitions{cfg: cfg, pool: pool, metrics: m, held: map[string]uuid.UUID{}, full: map[string]time.Time{}}
}

// partitionsResult is what one pass did, to the audit table and to the
// outbox.
type partitionsResult struct {
	Created, OutboxCreated int
	Dropped, OutboxDropped []string
	// Held counts the past partitions kept because too many of their
	// rows belong to tasks that still exist or, in the outbox, for rows
	// still to publish.
	Held, OutboxHeld int
	// Kept counts the rows of tasks that still exist moved into a
	// DEFAULT partition before their partition was dropped; Swept the
	// rows of deleted tasks deleted from there.
	Kept, Swept int
	// LogRetired counts the outbox log's rows retired (outbox.PruneLog).
	LogRetired int64
}

func (p *partitions) service() *service {
	return &service{
		name:     componentPartitions,
		interval: p.cfg.Interval,
		msg:      "partitions pass",
		level:    slog.LevelInfo,
		start: func() {
			p.held = map[string]uuid.UUID{}
			p.full = map[string]time.Time{}
		},
		pass: func(ctx context.Context) ([]any, error) {
			res, err := p.runOnce(ctx)
			if res.Created+res.OutboxCreated == 0 && len(res.Dropped)+len(res.OutboxDropped) == 0 && res.LogRetired == 0 {
				return nil, err
			}
			return []any{"created", res.Created, "dropped", res.Dropped, "held", res.Held,
				"outbox_created", res.OutboxCreated, "outbox_dropped", res.OutboxDropped, "outbox_held", res.OutboxHeld,
				"kept", res.Kept, "swept", res.Swept, "outbox_log_retired", res.LogRetired}, err
		},
		failed: func() { p.metrics.failures.WithLabelValues(componentPartitions).Inc() },
	}
}

// runOnce creates the partitions ahead and drops those no longer written
// to, for both tables; a failure of one step does not stop the others.
func (p *partitions) runOnce(ctx context.Context) (partitionsResult, error) {
	var res partitionsResult
	n, errAudit := transition.Extend(ctx, p.pool, p.cfg.Width, p.cfg.Ahead, p.cfg.LockTimeout)
	res.Created = n
	n, errOutbox := outbox.Extend(ctx, p.pool, p.cfg.Width, p.cfg.Ahead, int64(p.cfg.OutboxMinIDs), p.cfg.LockTimeout)
	res.OutboxCreated = n
	seen := map[string]bool{}
	errs := []error{errAudit, errOutbox, p.dropAudit(ctx, &res, seen), p.dropOutbox(ctx, &res, seen)}
	// The outbox log's published rows go after the time a partition of
	// outbox_row does, Width: those of tasks that still exist into
	// outbox_row, as a dropped partition's go into its DEFAULT one.
	var errLog error
	res.LogRetired, errLog = outbox.PruneLog(ctx, p.pool, p.cfg.Width)
	errs = append(errs, errLog)
	p.forget(seen)
	if len(res.Dropped)+len(res.OutboxDropped) > 0 {
		for _, dflt := range []string{auditDefault, outboxDefault} {
			n, err := partition.Sweep(ctx, p.pool, dflt)
			res.Swept += n
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}

// dropAudit drops the past audit partitions, oldest first.
func (p *partitions) dropAudit(ctx context.Context, res *partitionsResult, seen map[string]bool) error {
	parts, now, err := transition.Partitions(ctx, p.pool)
	if err != nil {
		return err
	}
	var errs []error
	for _, part := range parts {
		seen[part.Name] = true
		if part.Default || part.To.IsZero() || part.To.After(now) {
			continue
		}
		open, err := partition.OpenBefore(ctx, p.pool, part.To)
		if err != nil {
			errs = append(errs, err)
			break
		}
		if open {
			break // and so for every later partition
		}
		if err := p.retire(ctx, auditTable, part.Name, &res.Dropped, &res.Held, &res.Kept); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// dropOutbox drops the outbox partitions whose ids have all been taken
// and whose rows are all finished, lowest ids first.
func (p *partitions) dropOutbox(ctx context.Context, res *partitionsResult, seen map[string]bool) error {
	parts, last, now, err := outbox.Partitions(ctx, p.pool)
	if err != nil {
		return err
	}
	var errs []error
	for _, part := range parts {
		seen[part.Name] = true
		if part.Default || part.To == 0 || part.To-1 > last {
			continue
		}
		since, ok := p.full[part.Name]
		if !ok {
			p.full[part.Name] = now // every id taken before now; dropped from the next pass on
			continue
		}
		open, err := partition.OpenBefore(ctx, p.pool, since)
		if err != nil {
			errs = append(errs, err)
			break
		}
		if open {
			continue
		}
		unfinished, err := outbox.Unfinished(ctx, p.pool, part)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if unfinished {
			res.OutboxHeld++
			continue
		}
		if err := p.retire(ctx, outboxTable, part.Name, &res.OutboxDropped, &res.OutboxHeld, &res.Kept); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// retire drops the partition part of table, keeping the rows of the
// tasks that still exist, unless a task it is remembered with still
// exists or too many of its rows are still needed (then it is held).
// It counts in dropped, held and kept.
func (p *partitions) retire(ctx context.Context, table, part string, dropped *[]string, held, kept *int) error {
	if id, ok := p.held[part]; ok {
		exists, err := partition.TaskExists(ctx, p.pool, id)
		if err != nil {
			return err
		}
		if exists {
			*held++
			return nil
		}
		delete(p.held, part)
	}
	n, ok, err := partition.Retire(ctx, p.pool, table, part, p.cfg.KeepMax, p.cfg.LockTimeout)
	if err != nil {
		return err
	}
	if ok {
		*dropped = append(*dropped, part)
		*kept += n
		return nil
	}
	*held++
	id, found, err := partition.Blocker(ctx, p.pool, part)
	if err == nil && found {
		p.held[part] = id
	}
	return err
}

// forget drops what the pass remembers of the partitions that are gone.
func (p *partitions) forget(seen map[string]bool) {
	for name := range p.held {
		if !seen[name] {
			delete(p.held, name)
		}
	}
	for name := range p.full {
		if !seen[name] {
			delete(p.full, name)
		}
	}
}
