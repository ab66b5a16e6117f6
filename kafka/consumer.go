package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Delivery is one task record handed to a Sink.
type Delivery struct {
	// ID is the record's position (RecordID); Settle and Redeliver take it.
	ID string
	// Value is the decoded record; Err is set (wrapping ErrPoison) when it
	// names no valid task.
	Value Value
	Err   error
	// RawTaskID is the task_id as the record had it (for dead-lettering
	// poison).
	RawTaskID string
}

// Sink receives deliveries. Like stream.Sink: the consumer reserves handler
// slots before it polls, and Process takes over the records (it settles
// each through Consumer.Settle or Consumer.Redeliver, or leaves it
// unsettled to be delivered again to the partition's next owner).
type Sink interface {
	Reserve(n int) int
	SlotFreed() <-chan struct{}
	Process(ctx context.Context, ds []Delivery, reserved int)
}

// DefaultPoll is the most records one poll asks for.
const DefaultPoll = 256

// Consumer is one member of the task topic's consumer group.
//
// Offsets: the consumer remembers, per assigned partition, the records it
// has delivered and which of them are settled, and commits each partition
// up to its lowest unsettled record (never past a record whose outcome is
// not yet in Postgres). Commits run every CommitInterval, when a partition
// is revoked, and at Close. A partition that is revoked or lost forgets its
// records; settling them later commits nothing (the next owner delivers
// them again).
type Consumer struct {
	cfg  Config
	cl   *kgo.Client
	sink Sink
	log  *slog.Logger
	poll int

	mu        sync.Mutex
	parts     map[partKey]*partState
	redeliver []redelivery // by due time
	dirty     bool
	kick      chan struct{} // wakes the poll loop for a redelivery

	commitStop, commitDone chan struct{}
	closeOnce              sync.Once
}

type partKey struct {
	topic     string
	partition int32
}

type partState struct {
	// pending are the delivered offsets not yet below the commit point, in
	// order; settled marks those settled.
	pending []int64
	settled map[int64]bool
	held    map[int64]Delivery
	// commit is the next offset to commit; committed the last committed.
	commit, committed int64
	epoch             int32
}

type redelivery struct {
	d  Delivery
	at time.Time
}

// NewConsumer joins cfg.Group on cfg.Topic (a new client; extra options
// come last) and hands records to sink once Run runs.
func NewConsumer(cfg Config, sink Sink, logger *slog.Logger, extra ...kgo.Opt) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if sink == nil {
		return nil, configErr("sink", "is required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Consumer{cfg: cfg, sink: sink, poll: DefaultPoll, parts: map[partKey]*partState{},
		kick: make(chan struct{}, 1), commitStop: make(chan struct{}), commitDone: make(chan struct{}),
		log: logger.With("component", "kafka-consumer", "topic", cfg.Topic, "group", cfg.Group)}
	opts := append(cfg.clientOpts(),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	)
	cl, err := kgo.NewClient(append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka consumer: %w", err)
	}
	c.cl = cl
	go c.runCommits()
	return c, nil
}

// Client returns the consumer's client (for lag queries and tests).
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Run polls records and hands them to the Sink until ctx is cancelled.
// Call Close after the Sink has settled what it could.
func (c *Consumer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		n := c.sink.Reserve(c.poll)
		if n == 0 {
			select {
			case <-ctx.Done():
			case <-c.sink.SlotFreed():
			}
			continue
		}
		ds, wait := c.dueRedeliveries(n, time.Now())
		if len(ds) < n {
			pctx, cancel := context.WithTimeout(ctx, min(wait, time.Second))
			ds = append(ds, c.pollOnce(pctx, n-len(ds))...)
			cancel()
		}
		if len(ds) == 0 {
			c.sink.Process(ctx, nil, n) // gives the slots back
			continue
		}
		c.sink.Process(ctx, ds, n)
	}
	return nil
}

// pollOnce polls up to n records and remembers them; the rebalance that
// polling blocks is allowed once they are recorded.
func (c *Consumer) pollOnce(ctx context.Context, n int) []Delivery {
	fetches := c.cl.PollRecords(ctx, n)
	defer c.cl.AllowRebalance()
	if fetches.IsClientClosed() {
		return nil
	}
	fetches.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			c.log.Warn("kafka fetch failed", "partition", p, "err", err)
		}
	})
	var ds []Delivery
	c.mu.Lock()
	defer c.mu.Unlock()
	fetches.EachRecord(func(r *kgo.Record) {
		k := partKey{r.Topic, r.Partition}
		ps := c.parts[k]
		if ps == nil {
			ps = &partState{settled: map[int64]bool{}, held: map[int64]Delivery{}, commit: -1, committed: -1}
			c.parts[k] = ps
		}
		if len(ps.pending) > 0 && r.Offset <= ps.pending[len(ps.pending)-1] {
			return // already delivered in this assignment
		}
		d := Delivery{ID: RecordID(r), RawTaskID: RawTaskID(r)}
		d.Value, d.Err = Decode(r)
		ps.pending = append(ps.pending, r.Offset)
		ps.held[r.Offset] = d
		ps.epoch = r.LeaderEpoch
		ds = append(ds, d)
	})
	return ds
}

// dueRedeliveries takes up to n due redeliveries and reports how long until
// the next one is due (a second at most).
func (c *Consumer) dueRedeliveries(n int, now time.Time) ([]Delivery, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ds []Delivery
	i := 0
	for ; i < len(c.redeliver) && len(ds) < n && !c.redeliver[i].at.After(now); i++ {
		ds = append(ds, c.redeliver[i].d)
	}
	c.redeliver = c.redeliver[i:]
	wait := time.Second
	if len(c.redeliver) > 0 {
		wait = max(time.Millisecond, min(wait, c.redeliver[0].at.Sub(now)))
	}
	return ds, wait
}

// Settle marks delivered records settled: their outcome is recorded, so the
// offset may move past them. Ids of partitions no longer assigned here are
// ignored.
func (c *Consumer) Settle(ids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		ps, off, _, ok := c.heldLocked(id)
		if !ok {
			continue
		}
		delete(ps.held, off)
		ps.settled[off] = true
		for len(ps.pending) > 0 && ps.settled[ps.pending[0]] {
			delete(ps.settled, ps.pending[0])
			ps.commit = ps.pending[0] + 1
			ps.pending = ps.pending[1:]
			c.dirty = true
		}
	}
}

// heldLocked finds the record id names among those delivered here and not
// yet settled: its partition's state, its offset and its delivery. ok is
// false for a malformed id, a partition no longer assigned here, or a
// record not held.
func (c *Consumer) heldLocked(id string) (ps *partState, off int64, d Delivery, ok bool) {
	topic, p, off, err := ParsePosition(id)
	if err != nil {
		return nil, 0, Delivery{}, false
	}
	if ps = c.parts[partKey{topic, p}]; ps == nil {
		return nil, 0, Delivery{}, false
	}
	d, ok = ps.held[off]
	return ps, off, d, ok
}

// Redeliver hands records back to the Sink after delay (their outcome
// could not be recorded); until then they hold their partition's offset.
func (c *Consumer) Redeliver(delay time.Duration, ids ...string) {
	at := time.Now().Add(delay)
	c.mu.Lock()
	for _, id := range ids {
		if _, _, d, ok := c.heldLocked(id); ok {
			c.redeliver = append(c.redeliver, redelivery{d: d, at: at})
		}
	}
	sort.SliceStable(c.redeliver, func(i, j int) bool { return c.redeliver[i].at.Before(c.redeliver[j].at) })
	c.mu.Unlock()
}

// toCommit returns the commit points of partitions that moved (all of
// them, or those in only) and marks them committed.
func (c *Consumer) toCommitLocked(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	out := map[string]map[int32]kgo.EpochOffset{}
	add := func(k partKey, ps *partState) {
		if ps.commit < 0 || ps.commit == ps.committed {
			return
		}
		if out[k.topic] == nil {
			out[k.topic] = map[int32]kgo.EpochOffset{}
		}
		out[k.topic][k.partition] = kgo.EpochOffset{Epoch: ps.epoch, Offset: ps.commit}
		ps.committed = ps.commit
	}
	if only == nil {
		for k, ps := range c.parts {
			add(k, ps)
		}
		c.dirty = false
		return out
	}
	for topic, ps := range only {
		for _, p := range ps {
			if st := c.parts[partKey{topic, p}]; st != nil {
				add(partKey{topic, p}, st)
			}
		}
	}
	return out
}

func (c *Consumer) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) {
	if len(offsets) == 0 {
		return
	}
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsgReq, resp *kmsgResp, err error) {
		if err == nil {
			err = commitErr(resp)
		}
		if err != nil {
			// The records are delivered again to whoever owns the
			// partition next; duplicates are harmless.
			c.log.Warn("kafka offset commit failed", "err", err)
		}
	})
}

func (c *Consumer) runCommits() {
	defer close(c.commitDone)
	t := time.NewTicker(c.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-c.commitStop:
			return
		case <-t.C:
		}
		c.mu.Lock()
		var offsets map[string]map[int32]kgo.EpochOffset
		if c.dirty {
			offsets = c.toCommitLocked(nil)
		}
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.commit(ctx, offsets)
		cancel()
	}
}

// revoked commits what is settled on the revoked partitions and forgets
// them.
func (c *Consumer) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.mu.Lock()
	offsets := c.toCommitLocked(revoked)
	c.forgetLocked(revoked)
	c.mu.Unlock()
	c.commit(ctx, offsets)
}

// lost forgets partitions lost without a chance to commit.
func (c *Consumer) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(lost)
}

func (c *Consumer) forgetLocked(parts map[string][]int32) {
	for topic, ps := range parts {
		for _, p := range ps {
			delete(c.parts, partKey{topic, p})
		}
	}
	kept := c.redeliver[:0]
	for _, r := range c.redeliver {
		topic, p, _, _ := ParsePosition(r.d.ID)
		if c.parts[partKey{topic, p}] != nil {
			kept = append(kept, r)
		}
	}
	c.redeliver = kept
}

// Close commits what is settled, leaves the group and closes the client.
func (c *Consumer) Close() {
	c.closeOnce.Do(func() {
		close(c.commitStop)
		<-c.commitDone
		c.mu.Lock()
		offsets := c.toCommitLocked(nil)
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c.commit(ctx, offsets)
		cancel()
		c.cl.Close()
	})
}
