package reclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/stream"
)

// Reclaimer claims idle pending entries of the task stream for this
// process's consumer and hands them to the Sink; it also republishes the
// tasks of pending entries that were trimmed or deleted. See the package
// documentation.
type Reclaimer struct {
	cfg     Config
	rdb     redis.UniversalClient
	db      *pgxpool.Pool
	sink    stream.Sink
	logger  *slog.Logger
	metrics *metrics

	mu sync.Mutex // serialises rounds; guards the fields below
	// backlog holds deleted entry ids whose tasks could not be republished
	// yet (Postgres unavailable); they are retried each round.
	backlog []string
	// noGroup is true while the group is missing (logged once).
	noGroup bool
	// sawGroup is set once a round found the group: only a group seen
	// and then missing was lost (at start-up the consumer may not have
	// created it yet).
	sawGroup bool
	// groupLost, when set, is called when a round finds the group missing.
	groupLost func()
	// takeoverFrom holds, per silent consumer, the entry id where the next
	// round's takeover scan of the current stream goes on (see takeOver);
	// takeoverFroms holds it for every priority's stream.
	takeoverFrom  map[string]string
	takeoverFroms map[string]map[string]string
	// cur is the priority stream a round is working on.
	cur priorityStream
	// kept is the slot a round keeps from one page to the next (0 or 1);
	// waited is set once the round has waited for a slot (reserve), began
	// is when the round began.
	kept   int
	waited bool
	began  time.Time
}

// priorityStream is one of the streams of the task stream (stream.Keys):
// its key and its priority.
type priorityStream struct {
	key      string
	priority int
}

// qualify gives msgs of the current stream their message ids
// (stream.QualifyID), which the sink and the transport use.
func (r *Reclaimer) qualify(msgs []redis.XMessage) []redis.XMessage {
	for i := range msgs {
		msgs[i].ID = stream.QualifyID(r.cur.priority, msgs[i].ID)
	}
	return msgs
}

// OnGroupLost makes r call f when a reclaim round finds the consumer group
// missing (NOGROUP) after an earlier round found it: Redis lost it, with
// its pending entries. f must return quickly. Call it before Run.
func (r *Reclaimer) OnGroupLost(f func()) { r.groupLost = f }

// maxBacklog bounds Reclaimer.backlog; the rescuer republishes tasks
// whose ids had to be dropped.
const maxBacklog = 100_000

// New returns a Reclaimer. sink is the processing path of fresh deliveries;
// cfg's Stream, Group, Consumer, MinIdle and LeaseIdle must be those of the
// worker behind sink (ingest.Config passes its own down), so that the
// reclaimer claims with the idle time the worker leaves its entries with.
// reg receives the metrics (nil: none are registered).
func New(cfg Config, rdb redis.UniversalClient, db *pgxpool.Pool, sink stream.Sink, logger *slog.Logger, reg prometheus.Registerer) (*Reclaimer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case rdb == nil:
		return nil, errors.New("reclaim: redis client is nil")
	case db == nil:
		return nil, errors.New("reclaim: database pool is nil")
	case sink == nil:
		return nil, errors.New("reclaim: sink is nil")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("reclaim: %w", err)
	}
	return &Reclaimer{
		cfg:     cfg,
		rdb:     rdb,
		db:      db,
		sink:    sink,
		logger:  logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer),
		metrics: m,

		takeoverFroms: map[string]map[string]string{},
	}, nil
}

// Config returns the configuration with defaults filled in.
func (r *Reclaimer) Config() Config { return r.cfg }

// Run runs a round at once and then every Interval until ctx is done; it
// returns nil then. A failed round is logged and counted; the next one
// runs as planned.
func (r *Reclaimer) Run(ctx context.Context) error {
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	for {
		r.runOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// roundResult is what one round did.
type roundResult struct {
	Claimed     int  // entries claimed and handed to the sink
	Deleted     int  // deleted entry ids XAUTOCLAIM reported
	Republished int  // tasks republished through a new outbox event
	TakenOver   int  // entries of expired leases claimed from silent consumers
	Skipped     bool // the sink had no free slot: (the rest of) the round was skipped
}

// runOnce runs one round: republish the backlog, then, on the stream of
// every priority, highest first, claim idle entries page by page within
// the sink's free capacity, then take over the entries of expired leases
// held by silent consumers (takeOver; only when LeaseIdle is below
// MinIdle, else XAUTOCLAIM has taken them). Errors are logged and counted
// here.
func (r *Reclaimer) runOnce(ctx context.Context) roundResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waited, r.began = false, time.Now()
	defer r.giveBack(ctx)
	var res roundResult
	if len(r.backlog) > 0 && ctx.Err() == nil {
		ids := r.backlog
		r.backlog = nil
		res.Republished += r.handleDeleted(ctx, ids)
	}
	for _, p := range stream.Priorities {
		if res.Skipped || ctx.Err() != nil {
			break
		}
		r.cur = priorityStream{key: stream.Key(r.cfg.Stream, p), priority: p}
		if r.takeoverFrom = r.takeoverFroms[r.cur.key]; r.takeoverFrom == nil {
			r.takeoverFrom = map[string]string{}
			r.takeoverFroms[r.cur.key] = r.takeoverFrom
		}
		r.claim(ctx, &res)
		if !res.Skipped && ctx.Err() == nil && r.cfg.LeaseIdle < r.cfg.MinIdle && !r.noGroup {
			r.takeOver(ctx, &res)
		}
	}
	if res.Claimed > 0 || res.Deleted > 0 || res.Republished > 0 || res.TakenOver > 0 {
		r.logger.Info("reclaimed pending entries", "claimed", res.Claimed, "deleted", res.Deleted, "republished", res.Republished,
			"taken_over", res.TakenOver)
	}
	return res
}

// claim pages through the PEL with XAUTOCLAIM, from the start, claiming at
// most as many entries per page as the sink has free slots, until the PEL
// is scanned or the sink is full.
func (r *Reclaimer) claim(ctx context.Context, res *roundResult) {
	cursor := "0-0"
	for ctx.Err() == nil {
		n := r.reserve(ctx, r.cfg.BatchSize)
		if n == 0 {
			res.Skipped = true
			return
		}
		msgs, next, deleted, err := r.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
			Stream:   r.cur.key,
			Group:    r.cfg.Group,
			Consumer: r.cfg.Consumer,
			MinIdle:  r.cfg.MinIdle,
			Start:    cursor,
			Count:    int64(n),
		}).Result()
		if err != nil {
			r.sink.Process(ctx, nil, n) // give the slots back
			r.claimFailed(ctx, err)
			return
		}
		if r.noGroup {
			r.noGroup = false
			r.logger.Info("consumer group is back")
		}
		r.sawGroup = true
		// Hand over first: the slots were reserved for these entries.
		r.hand(ctx, r.qualify(msgs), n)
		res.Claimed += len(msgs)
		r.metrics.add(resultClaimed, len(msgs))
		if len(deleted) > 0 {
			res.Deleted += len(deleted)
			r.metrics.add(resultDeleted, len(deleted))
			for i, id := range deleted {
				deleted[i] = stream.QualifyID(r.cur.priority, id)
			}
			res.Republished += r.handleDeleted(ctx, deleted)
		}
		if next == "0-0" || next == "" {
			return
		}
		cursor = next
	}
}

// reserve reserves up to n slots of the sink for a page: the one the
// round kept from its page before, and more. A reservation that finds
// none free waits for one when the sink is a stream.SlotWaiter: the
// round's first up to Interval (the consumer's blocking read holds a slot
// while the streams are idle, and without the wait a worker of one slot
// would almost never reclaim), a later one for what is left of Interval
// since the round began. A later one finds none only after a page that
// took every slot it had (a page that claims fewer keeps one), so a round
// goes on claiming a backlog of idle entries as slots come free, for
// about an Interval, rather than a page of free slots per Interval.
func (r *Reclaimer) reserve(ctx context.Context, n int) int {
	got := r.kept
	r.kept = 0
	if got >= n {
		return got
	}
	if got += r.sink.Reserve(n - got); got > 0 {
		return got
	}
	w, ok := r.sink.(stream.SlotWaiter)
	if !ok {
		return 0
	}
	wait := r.cfg.Interval
	if r.waited {
		wait -= time.Since(r.began)
	}
	r.waited = true
	if wait <= 0 {
		return 0
	}
	return w.ReserveFirst(ctx, n, wait)
}

// hand hands a page's entries to the sink on the n slots reserved for
// them, keeping one left over for the round's next page (so that a
// round that got a slot goes through every stream with it).
func (r *Reclaimer) hand(ctx context.Context, msgs []redis.XMessage, n int) {
	if n > len(msgs) {
		r.kept, n = 1, n-1
	}
	if n > 0 {
		r.sink.Process(ctx, msgs, n)
	}
}

// giveBack gives the slot a round kept back to the sink at its end.
func (r *Reclaimer) giveBack(ctx context.Context) {
	if r.kept > 0 {
		r.sink.Process(ctx, nil, r.kept)
		r.kept = 0
	}
}

func (r *Reclaimer) claimFailed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return // shutting down
	}
	if stream.IsNoGroup(err) {
		// The consumer recreates the group (MKSTREAM); the rescuer
		// republishes what was lost with it.
		if !r.noGroup {
			r.noGroup = true
			if !r.sawGroup {
				r.logger.Info("consumer group not created yet: skipping reclaim rounds until it exists", "err", err)
				return
			}
			r.logger.Warn("consumer group missing: skipping reclaim rounds until it is recreated", "err", err)
			if r.groupLost != nil {
				r.groupLost()
			}
		}
		return
	}
	r.metrics.add(resultError, 1)
	r.logger.Error("claim idle pending entries", "err", fmt.Errorf("xautoclaim %s: %w", r.cur.key, err))
}
