package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/configerr"
)

// Defaults (docs/ARCHITECTURE.md §4 and §5).
const (
	DefaultStream = "ingest:tasks"
	DefaultGroup  = "ingest-workers"
	// DefaultBlock bounds a blocking read, and so how long a cancelled
	// consumer takes to stop.
	DefaultBlock = 2 * time.Second
	// DefaultCount is the most entries one read asks for (fewer when the
	// Sink has fewer free slots).
	DefaultCount = 32
	// DefaultErrorBackoff is the wait after a failed read.
	DefaultErrorBackoff = time.Second
)

// Config names a consumer group member and tunes its reads. Zero fields
// take the Default* values, except Consumer, which is required.
type Config struct {
	// Stream is the task stream key.
	Stream string
	// Group is the consumer group.
	Group string
	// Consumer is this member's name, unique among live workers.
	Consumer string
	// Block is how long one read waits for new entries; it must be finite.
	Block time.Duration
	// Count is the most entries one read asks for.
	Count int
	// ErrorBackoff is the wait after a failed read or group creation.
	ErrorBackoff time.Duration
	// HandBackIdle is the idle time that makes a pending entry claimable
	// at once by the reclaimers (their min-idle, INGEST_REDIS_RECLAIM_IDLE_MS).
	// A blocking read of every priority's stream may return an entry per
	// stream; the ones beyond the free slots are handed back so. Zero:
	// DefaultHandBackIdle.
	HandBackIdle time.Duration
}

// DefaultHandBackIdle is the default Config.HandBackIdle: the reclaimers'
// default min-idle (package reclaim's DefaultMinIdle).
const DefaultHandBackIdle = 10 * time.Minute

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c Config) WithDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.Group = cmp.Or(c.Group, DefaultGroup)
	c.Block = cmp.Or(c.Block, DefaultBlock)
	c.Count = cmp.Or(c.Count, DefaultCount)
	c.ErrorBackoff = cmp.Or(c.ErrorBackoff, DefaultErrorBackoff)
	c.HandBackIdle = cmp.Or(c.HandBackIdle, DefaultHandBackIdle)
	return c
}

// Validate checks the configuration, zero fields taking their defaults,
// and names the bad field: "stream: Consumer: is required".
func (c Config) Validate() error {
	c = c.WithDefaults()
	bad := func(setting, format string, args ...any) error {
		return configerr.New("stream", nil, setting, format, args...)
	}
	switch {
	case c.Stream == "":
		return bad("Stream", "is required")
	case c.Group == "":
		return bad("Group", "is required")
	case c.Consumer == "":
		return bad("Consumer", "is required")
	case c.Block < time.Millisecond:
		return bad("Block", "must be at least 1ms (a finite blocking read), got %s", c.Block)
	case c.Count < 1:
		return bad("Count", "must be at least 1, got %d", c.Count)
	case c.ErrorBackoff < 0:
		return bad("ErrorBackoff", "must be at least 0s, got %s", c.ErrorBackoff)
	}
	return nil
}

// Group is this consumer's handle on the consumer group: group creation,
// acknowledgement, idle-time control and statistics. It is safe for
// concurrent use.
type Group struct {
	cfg Config
	rdb redis.UniversalClient
}

// NewGroup returns the group handle of cfg.Consumer.
func NewGroup(cfg Config, rdb redis.UniversalClient) (*Group, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil {
		return nil, errors.New("stream: nil redis client")
	}
	return &Group{cfg: cfg, rdb: rdb}, nil
}

// Config returns the configuration with defaults filled in.
func (g *Group) Config() Config { return g.cfg }

// IsNoGroup reports whether err says the group (or its stream) is gone:
// NOGROUP from a command, or UNBLOCKED from a blocked read whose stream or
// group was deleted meanwhile.
func IsNoGroup(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "NOGROUP") || strings.HasPrefix(msg, "UNBLOCKED")
}

// isBusyGroup reports whether err says the group already exists. Matched by
// prefix: the text after the code differs between Redis versions.
func isBusyGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP")
}

// EnsureGroup creates the group (and the stream, MKSTREAM) on the stream
// of every priority (Keys) if it does not exist. A new group starts at the
// beginning of its stream, so entries added before any worker started are
// delivered too.
func (g *Group) EnsureGroup(ctx context.Context) error {
	pipe := g.rdb.Pipeline()
	keys := Keys(g.cfg.Stream)
	cmds := make([]*redis.StatusCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.XGroupCreateMkStream(ctx, k, g.cfg.Group, "0")
	}
	_, _ = pipe.Exec(ctx)
	for i, c := range cmds {
		if err := c.Err(); err != nil && !isBusyGroup(err) {
			return fmt.Errorf("xgroup create %s %s: %w", keys[i], g.cfg.Group, err)
		}
	}
	return nil
}

// Idle is the idle time to give one pending entry.
type Idle struct {
	ID   string
	Idle time.Duration
}

// xclaimArgsFor is XCLAIM <stream> <group> <consumer> 0 <ids...> [IDLE ms]
// JUSTID. JUSTID keeps the delivery counter; entries that are no longer
// pending are left alone (no FORCE).
func (g *Group) xclaimArgsFor(stream, consumer string, idle time.Duration, ids []string) []any {
	args := make([]any, 0, 8+len(ids))
	args = append(args, "xclaim", stream, g.cfg.Group, consumer, 0)
	for _, id := range ids {
		args = append(args, id)
	}
	if idle > 0 {
		args = append(args, "idle", idle.Milliseconds())
	}
	return append(args, "justid")
}

// Touch resets the idle time of pending entries to zero (the heartbeat of
// long-running entries) and makes them this consumer's. Ids are message
// ids (QualifyID) of any priority's stream.
func (g *Group) Touch(ctx context.Context, ids ...string) error {
	return g.SetIdle(ctx, 0, ids...)
}

// SetIdle sets the idle time of pending entries and makes them this
// consumer's. An entry with idle time i becomes claimable by an XAUTOCLAIM
// with min-idle m after m-i. Ids are message ids (QualifyID) of any
// priority's stream.
func (g *Group) SetIdle(ctx context.Context, idle time.Duration, ids ...string) error {
	return g.claimTo(ctx, g.cfg.Consumer, idle, ids)
}

// claimTo XCLAIMs the message ids for consumer with the idle time, one
// command per stream, in one pipeline when they are of several streams.
func (g *Group) claimTo(ctx context.Context, consumer string, idle time.Duration, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	per := byStream(g.cfg.Stream, ids)
	if len(per) == 1 {
		if err := g.rdb.Do(ctx, g.xclaimArgsFor(per[0].stream, consumer, idle, per[0].ids)...).Err(); err != nil {
			return fmt.Errorf("xclaim %s %d entries for %s idle %s: %w", per[0].stream, len(ids), consumer, idle, err)
		}
		return nil
	}
	pipe := g.rdb.Pipeline()
	for _, s := range per {
		pipe.Do(ctx, g.xclaimArgsFor(s.stream, consumer, idle, s.ids)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("xclaim %d entries of %s (all priorities) for %s idle %s: %w", len(ids), g.cfg.Stream, consumer, idle, err)
	}
	return nil
}

// AbandonedConsumer is the consumer that the worker named consumer hands
// the entries of its abandoned runs to (Group.Abandon). No worker reads as
// it, so it falls silent at once, and the reclaimers of other workers take
// its entries over once their tasks' leases have expired (package
// reclaim), as they do a dead worker's. The leader's idle-consumer cleanup
// removes it once it holds nothing.
func AbandonedConsumer(consumer string) string { return consumer + "/abandoned" }

// Abandon hands pending entries of this consumer to its AbandonedConsumer,
// their idle time reset: the entries of runs this worker gave up (a handler
// that ignores its timeout) whose tasks other workers should take over once
// their leases expire, and that this worker's own reclaimer must not
// swallow.
func (g *Group) Abandon(ctx context.Context, ids ...string) error {
	return g.claimTo(ctx, AbandonedConsumer(g.cfg.Consumer), 0, ids)
}

// Apply acknowledges acks and sets idles, in one pipeline: the form the
// worker's completer uses after a commit. Ids are message ids (QualifyID)
// of any priority's stream.
func (g *Group) Apply(ctx context.Context, acks []string, idles []Idle) error {
	if len(acks) == 0 && len(idles) == 0 {
		return nil
	}
	if len(acks) == 0 && len(idles) == 1 {
		return g.SetIdle(ctx, idles[0].Idle, idles[0].ID)
	}
	pipe := g.rdb.Pipeline()
	for _, s := range byStream(g.cfg.Stream, acks) {
		pipe.XAck(ctx, s.stream, g.cfg.Group, s.ids...)
	}
	for _, i := range idles {
		p, id := SplitID(i.ID)
		pipe.Do(ctx, g.xclaimArgsFor(Key(g.cfg.Stream, p), g.cfg.Consumer, i.Idle, []string{id})...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("xack %d / xclaim %d entries of %s: %w", len(acks), len(idles), g.cfg.Stream, err)
	}
	return nil
}

// Stats returns the length of the stream of the default priority
// (Config.Stream) and the group's pending count there. A missing stream or
// group counts as empty. PriorityStats covers every priority's stream.
func (g *Group) Stats(ctx context.Context) (length, pending int64, err error) {
	return g.StatsOf(ctx, g.cfg.Stream)
}

// StatsOf is Stats of one stream key (one of Keys(Config.Stream)).
func (g *Group) StatsOf(ctx context.Context, key string) (length, pending int64, err error) {
	pipe := g.rdb.Pipeline()
	l := pipe.XLen(ctx, key)
	p := pipe.XPending(ctx, key, g.cfg.Group)
	_, _ = pipe.Exec(ctx)
	if err := l.Err(); err != nil {
		return 0, 0, fmt.Errorf("xlen %s: %w", key, err)
	}
	switch err := p.Err(); {
	case err == nil:
		pending = p.Val().Count
	case IsNoGroup(err) || errors.Is(err, redis.Nil):
	default:
		return 0, 0, fmt.Errorf("xpending %s %s: %w", key, g.cfg.Group, err)
	}
	return l.Val(), pending, nil
}

// Overdue returns how long the most idle of the group's pending entries
// idle for at least minIdle has been idle beyond minIdle (0 when none is,
// or the group does not exist). It looks at the first scan such entries in
// id order (XPENDING ... IDLE minIdle - + scan), so with more of them the
// answer is a lower bound.
func (g *Group) Overdue(ctx context.Context, minIdle time.Duration, scan int64) (time.Duration, error) {
	return g.OverdueOf(ctx, g.cfg.Stream, minIdle, scan)
}

// OverdueOf is Overdue of one stream key (one of Keys(Config.Stream)).
func (g *Group) OverdueOf(ctx context.Context, key string, minIdle time.Duration, scan int64) (time.Duration, error) {
	ps, err := g.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: key, Group: g.cfg.Group, Idle: minIdle, Start: "-", End: "+", Count: scan,
	}).Result()
	switch {
	case IsNoGroup(err) || errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("xpending %s %s idle %s: %w", key, g.cfg.Group, minIdle, err)
	}
	var most time.Duration
	for _, p := range ps {
		most = max(most, p.Idle-minIdle)
	}
	return most, nil
}
