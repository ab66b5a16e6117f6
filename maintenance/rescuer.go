package maintenance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	ingeststream "github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// rescueResult counts what one rescuer pass did.
type rescueResult struct {
	// Examined candidate tasks (QUEUED, RETRYING, RUNNING with an expired
	// lease).
	Examined int
	// Missing: eligible tasks whose entry is not in Redis.
	Missing int
	// Rescued: tasks given a new outbox row (Missing minus those that
	// changed meanwhile).
	Rescued int
}

// rescuer finds tasks that should be in Redis but are not, and gives each
// a new outbox row. A candidate is a QUEUED or due RETRYING task, or a
// RUNNING task whose lease expired, that has no unsent outbox row and whose
// latest row was SENT more than Grace ago (or that has no outbox row at
// all); package task writes that question in SQL (task.RescueCandidates).
// It is missing when that row's stream entry is gone (XRANGE id id is
// empty, the stream or the group does not exist) or was delivered and is no
// longer pending (acknowledged, or its PEL lost).
//
// A task whose latest outbox row is DEAD (the relay gave up, e.g. during a
// long Redis outage) is rescued too once that row is older than Grace: Redis
// must catch up with Postgres without an operator. The DEAD row stays for
// forensics; while the stream keeps failing, each task gains at most one
// DEAD row per full relay retry cycle.
//
// Only the leader runs it, but a rescue is safe whoever runs it: each
// re-checks the task under its row lock (task.Rescue). The passes of one
// rescuer run one at a time.
type rescuer struct {
	cfg     RescuerConfig
	pool    *pgxpool.Pool
	rdb     redis.UniversalClient
	metrics *metrics
	cursors map[task.RescueClass]task.RescueCursor
}

func newRescuer(cfg RescuerConfig, pool *pgxpool.Pool, rdb redis.UniversalClient, m *metrics) *rescuer {
	return &rescuer{cfg: cfg, pool: pool, rdb: rdb, metrics: m, cursors: map[task.RescueClass]task.RescueCursor{}}
}

// service is the rescuer as the maintainer runs it.
func (r *rescuer) service() *service {
	return &service{
		name:     componentRescuer,
		interval: r.cfg.Interval,
		msg:      "rescued tasks missing from Redis",
		pass: func(ctx context.Context) ([]any, error) {
			res, err := r.runOnce(ctx)
			if err != nil || res.Missing == 0 {
				return nil, err
			}
			return []any{"examined", res.Examined, "missing", res.Missing, "rescued", res.Rescued}, nil
		},
		failed: func() { r.metrics.failures.WithLabelValues(componentRescuer).Inc() },
		kick:   make(chan struct{}, 1),
		urgent: func(ctx context.Context) ([]any, error) {
			res, passes, err := r.urgent(ctx)
			return []any{"passes", passes, "examined", res.Examined, "missing", res.Missing, "rescued", res.Rescued}, err
		},
		urgentMsg: "rescued tasks after a reported Redis data loss",
	}
}

// urgent rescues without the grace, from the first candidate of each class
// on, pass after pass until every class was examined to its end (or
// maxUrgentPasses): the rescue after a reported Redis data loss. It
// returns the sums and the number of passes.
func (r *rescuer) urgent(ctx context.Context) (rescueResult, int, error) {
	clear(r.cursors)
	var total rescueResult
	for n := 1; ; n++ {
		res, err := r.pass(ctx, 0)
		total.Examined += res.Examined
		total.Missing += res.Missing
		total.Rescued += res.Rescued
		if err != nil || len(r.cursors) == 0 || n == maxUrgentPasses {
			return total, n, err
		}
	}
}

// runOnce is one scheduled pass, with the configured grace.
func (r *rescuer) runOnce(ctx context.Context) (rescueResult, error) {
	return r.pass(ctx, r.cfg.Grace)
}

// pass examines up to PagesPerRun pages of each class of candidate. grace
// is a parameter so that a pass can be asked for without it (after a known
// Redis data loss, say), next to the scheduled ones.
func (r *rescuer) pass(ctx context.Context, grace time.Duration) (rescueResult, error) {
	var res rescueResult
	for _, class := range task.RescueClasses {
		for range r.cfg.PagesPerRun {
			more, err := r.page(ctx, class, grace, &res)
			if err != nil {
				return res, err
			}
			if !more {
				delete(r.cursors, class) // start over next pass
				break
			}
		}
	}
	r.metrics.rescued.Add(float64(res.Rescued))
	return res, nil
}

// page examines one page of candidates of a class and rescues the missing
// ones; it returns whether the class has more pages.
func (r *rescuer) page(ctx context.Context, class task.RescueClass, grace time.Duration, res *rescueResult) (bool, error) {
	page, err := task.RescueCandidates(ctx, r.pool, class, r.cursors[class], r.cfg.BatchSize, grace)
	if err != nil {
		return false, err
	}
	r.cursors[class] = page.Next
	cands := page.Candidates
	res.Examined += len(cands)

	byStream := map[string][]task.RescueCandidate{}
	for _, c := range cands {
		if !c.Eligible {
			continue
		}
		if c.LastOutboxID == 0 {
			c.Stream = r.cfg.Stream
		}
		byStream[c.Stream] = append(byStream[c.Stream], c)
	}
	for stream, cs := range byStream {
		missing, err := r.missing(ctx, stream, cs)
		if err != nil {
			return false, err
		}
		res.Missing += len(missing)
		// The stream of a priority other than the default is the task
		// stream's too: the new row goes to the task stream, whose relay
		// publishes it to the stream of the task's priority.
		to := stream
		if _, err := ingeststream.PriorityOf(r.cfg.Stream, stream); err == nil {
			to = r.cfg.Stream
		}
		rescued, err := task.Rescue(ctx, r.pool, to, missing)
		if err != nil {
			return false, err
		}
		res.Rescued += len(rescued)
	}
	return page.More, nil
}

// missing returns the candidates (of one stream) whose entry is not on its
// way to a worker of the group. The group's last-delivered-id is read
// before the entries, so an entry delivered meanwhile still counts as
// undelivered (present).
func (r *rescuer) missing(ctx context.Context, stream string, cs []task.RescueCandidate) ([]task.RescueCandidate, error) {
	var check []task.RescueCandidate
	var missing []task.RescueCandidate
	for _, c := range cs {
		if c.LastOutboxID == 0 || c.StreamID == "" {
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
			id, err := parseStreamID(c.StreamID)
			if err != nil {
				continue // not an entry id: treat as gone
			}
			ids[i] = id
			ranges[i] = p.XRangeN(ctx, stream, c.StreamID, c.StreamID, 1)
			if !lastDelivered.less(id) {
				pendings[i] = p.XPendingExt(ctx, &redis.XPendingExtArgs{
					Stream: stream, Group: r.cfg.Group, Start: c.StreamID, End: c.StreamID, Count: 1,
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
