package stream

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// SlotNotifier may be implemented by a Sink: SlotFreed returns a channel
// that receives a value after slots are released, so a consumer that found
// no free slot waits for one instead of polling.
type SlotNotifier interface {
	SlotFreed() <-chan struct{}
}

// slotPoll is how often a consumer whose Sink is no SlotNotifier checks for
// free slots (and how often one that is checks anyway).
const slotPoll = 100 * time.Millisecond

// Consumer reads entries of the group into a Sink: first its own pending
// entries, then new ones. It never acknowledges: the Sink does.
type Consumer struct {
	cfg   Config
	rdb   redis.UniversalClient
	group *Group
	// reader reads the streams of every priority.
	reader *priorityReader
	sink   Sink
	log    *slog.Logger
	// groupLost, when set, is called when a read finds the group missing.
	groupLost func()
}

// NewConsumer returns a consumer of cfg.Consumer feeding sink.
func NewConsumer(cfg Config, rdb redis.UniversalClient, sink Sink, logger *slog.Logger) (*Consumer, error) {
	g, err := NewGroup(cfg, rdb)
	if err != nil {
		return nil, err
	}
	if sink == nil {
		return nil, errors.New("stream: nil sink")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = g.Config()
	return &Consumer{cfg: cfg, rdb: rdb, group: g, reader: newPriorityReader(cfg, rdb), sink: sink,
		log: logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer)}, nil
}

// OnGroupLost makes c call f each time a read finds the consumer group
// missing (NOGROUP) after c had it: Redis lost the group and its pending
// entries with it (a restart without persistence, FLUSHALL, a failover to
// a replica that missed writes). f must return quickly. Call it before Run.
func (c *Consumer) OnGroupLost(f func()) { c.groupLost = f }

// lostGroup reports the group's loss to the OnGroupLost hook.
func (c *Consumer) lostGroup() {
	if c.groupLost != nil {
		c.groupLost()
	}
}

// Run creates the group if needed, re-reads this consumer's own pending
// entries, then reads new entries until ctx is cancelled. A read in
// progress when ctx is cancelled completes (within Config.Block) and its
// entries go to the Sink. Redis errors are logged and retried; Run returns
// nil once ctx is done.
func (c *Consumer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := c.group.EnsureGroup(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			c.log.Warn("create consumer group failed; retrying", "err", err)
			c.sleep(ctx, c.cfg.ErrorBackoff)
			continue
		}
		c.readOwn(ctx)
		for ctx.Err() == nil {
			if err := c.readNew(ctx); IsNoGroup(err) {
				c.log.Warn("consumer group missing; recreating it", "err", err)
				c.lostGroup()
				break
			}
		}
	}
	return nil
}

// readNew reads new entries: as many as there are free slots (up to
// Config.Count) without blocking, from the streams of every priority in
// the order of PriorityShare, and, when there are none, waits for one with
// a blocking read. Waiting for new entries so holds a single slot, and the
// other free slots stay available to the reclaimer feeding the same Sink.
// (A blocking read of several streams can return an entry of each; those
// beyond the slot take more free slots, or are handed back to the
// reclaimers: see blockOnce.)
func (c *Consumer) readNew(ctx context.Context) error {
	n, _, err := c.readOnce(ctx, c.cfg.Count, func(ctx context.Context, n int) ([]redis.XMessage, error) {
		return c.reader.readNew(ctx, n)
	})
	if err != nil || n > 0 {
		return err
	}
	return c.blockOnce(ctx)
}

// blockOnce reserves one slot and waits up to Config.Block for a new entry
// of any priority's stream (XREADGROUP COUNT 1 over all of them). Should
// the read return more than one entry (several streams had one), it
// reserves free slots for the others; entries beyond those are handed back
// (Config.HandBackIdle), so a reclaimer claims them at its next round.
func (c *Consumer) blockOnce(ctx context.Context) error {
	n := c.reserve(ctx, 1)
	if n == 0 {
		return ctx.Err()
	}
	msgs, err := c.reader.block(context.WithoutCancel(ctx), c.cfg.Block)
	if err != nil {
		c.sink.Process(ctx, nil, n)
		if IsNoGroup(err) || isNoGroupIn(err) {
			return errNoGroup{err}
		}
		c.log.Warn("read stream failed", "err", err)
		c.sleep(ctx, c.cfg.ErrorBackoff)
		return err
	}
	if len(msgs) > n {
		n += c.sink.Reserve(len(msgs) - n)
	}
	if len(msgs) > n {
		var back []string
		for _, m := range msgs[n:] {
			back = append(back, m.ID)
		}
		msgs = msgs[:n]
		if err := c.group.SetIdle(context.WithoutCancel(ctx), c.cfg.HandBackIdle, back...); err != nil {
			c.log.Warn("hand back entries beyond the free slots failed; they are reclaimed after the reclaim idle time", "err", err)
		}
	}
	c.sink.Process(ctx, msgs, n)
	return nil
}

// readOwn hands this consumer's pending entries (left by an earlier run
// under the same name) of every priority's stream to the Sink, in batches,
// before new ones are read.
func (c *Consumer) readOwn(ctx context.Context) {
	for _, key := range c.reader.keys {
		last := "0"
		for ctx.Err() == nil {
			n, lastID, err := c.readOnce(ctx, c.cfg.Count, func(ctx context.Context, n int) ([]redis.XMessage, error) {
				return c.reader.readOwn(ctx, key, last, n)
			})
			if err != nil {
				if IsNoGroup(err) {
					c.lostGroup()
					return // the PEL went with the group
				}
				continue
			}
			if n == 0 {
				break
			}
			_, last = SplitID(lastID)
		}
	}
}

// readOnce reserves up to count slots, reads at most that many entries
// with read and hands them to the Sink. It returns how many entries it
// read and the last one's (qualified) id. Failures other than a missing
// group are logged and followed by Config.ErrorBackoff.
func (c *Consumer) readOnce(ctx context.Context, count int, read func(context.Context, int) ([]redis.XMessage, error)) (int, string, error) {
	n := c.reserve(ctx, count)
	if n == 0 {
		return 0, "", ctx.Err()
	}
	// The read is not cut off by ctx: entries it returns are already
	// delivered (in this consumer's PEL) and must reach the Sink.
	msgs, err := read(context.WithoutCancel(ctx), n)
	if err != nil {
		c.sink.Process(ctx, nil, n)
		if IsNoGroup(err) || isNoGroupIn(err) {
			return 0, "", errNoGroup{err}
		}
		c.log.Warn("read stream failed", "err", err)
		c.sleep(ctx, c.cfg.ErrorBackoff)
		return 0, "", err
	}
	if len(msgs) > n { // cannot happen (COUNT n); never overrun the slots
		msgs = msgs[:n]
	}
	c.sink.Process(ctx, msgs, n)
	if len(msgs) == 0 {
		return 0, "", nil
	}
	return len(msgs), msgs[len(msgs)-1].ID, nil
}

// isNoGroupIn reports whether a wrapped error (or a script's error)
// carries NOGROUP or UNBLOCKED.
func isNoGroupIn(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "NOGROUP") || strings.Contains(msg, "UNBLOCKED")
}

// errNoGroup is a read's error that says the group is gone; IsNoGroup
// holds for it.
type errNoGroup struct{ err error }

func (e errNoGroup) Error() string { return "NOGROUP: " + e.err.Error() }
func (e errNoGroup) Unwrap() error { return e.err }

// reserve waits until the Sink has at least one free slot and reserves up
// to count; it returns 0 when ctx is done first.
func (c *Consumer) reserve(ctx context.Context, count int) int {
	var freed <-chan struct{}
	if sn, ok := c.sink.(SlotNotifier); ok {
		freed = sn.SlotFreed()
	}
	t := time.NewTimer(slotPoll)
	defer t.Stop()
	for {
		if n := c.sink.Reserve(count); n > 0 {
			return n
		}
		t.Reset(slotPoll)
		select {
		case <-ctx.Done():
			return 0
		case <-freed:
		case <-t.C:
		}
	}
}

func (c *Consumer) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
