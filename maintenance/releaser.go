package maintenance

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/task"
)

const componentReleaser = "releaser"

// Defaults for ReleaserConfig.
const (
	// DefaultReleaseInterval is how often the releaser looks at the
	// limited kinds: about the longest a freed rate-limit start or a slot
	// freed by an expired lease waits for a parked task.
	DefaultReleaseInterval = 100 * time.Millisecond
	// DefaultWaitingInterval is how often the releaser counts the parked
	// tasks for ingest_kind_waiting_tasks.
	DefaultWaitingInterval = 5 * time.Second
	// transitTimeout is how long a released task counts as on its way to
	// a worker (after that it is assumed lost or started, and the
	// rescuer's business).
	transitTimeout = 10 * time.Second
)

// ReleaserConfig configures the releaser. Zero fields take the Default*
// values.
type ReleaserConfig struct {
	// Interval is the time between two passes over the limited kinds.
	Interval time.Duration
	// WaitingInterval is the time between two counts of the parked tasks.
	WaitingInterval time.Duration
}

// WithDefaults returns the configuration with every zero field set to its
// default.
func (c ReleaserConfig) WithDefaults() ReleaserConfig {
	if c.Interval == 0 {
		c.Interval = DefaultReleaseInterval
	}
	if c.WaitingInterval == 0 {
		c.WaitingInterval = DefaultWaitingInterval
	}
	return c
}

func (c ReleaserConfig) validate() error {
	switch {
	case c.Interval < time.Millisecond:
		return configErr("Releaser.Interval", "must be at least 1ms, got %s", c.Interval)
	case c.WaitingInterval < time.Millisecond:
		return configErr("Releaser.WaitingInterval", "must be at least 1ms, got %s", c.WaitingInterval)
	}
	return nil
}

// releaser wakes the parked tasks of limited kinds as their limits free
// slots and starts (task.Store.ReleaseParked), counting the tasks it woke
// that have not started yet as in transit so that it does not wake more
// than may start. Workers hand a slot freed by a finished run to a parked
// task themselves; the releaser covers slots freed by expired leases and
// starts freed by the passing of time under a rate limit. It also counts
// the parked tasks of each kind, by reason, for ingest_kind_waiting_tasks.
type releaser struct {
	cfg     ReleaserConfig
	store   *task.Store
	log     *slog.Logger
	metrics *metrics

	mu        sync.Mutex            // held by a pass
	transit   map[string][]released // by kind
	lastCount time.Time

	wmu     sync.Mutex // guards waiting, read at scrape time
	waiting waitingSnapshot
}

// released is a task the releaser woke, and when.
type released struct {
	id uuid.UUID
	at time.Time
}

// waitingSnapshot is the last count of parked tasks, by kind and reason.
type waitingSnapshot struct {
	at     time.Time
	counts map[[2]string]int64 // {kind, reason} → tasks
}

func newReleaser(cfg ReleaserConfig, store *task.Store, log *slog.Logger, m *metrics) *releaser {
	return &releaser{cfg: cfg, store: store, log: log, metrics: m}
}

func (r *releaser) service() *service {
	return &service{
		name:     componentReleaser,
		interval: r.cfg.Interval,
		msg:      "released parked tasks of limited kinds",
		level:    slog.LevelDebug, // it runs ten times a second
		start:    r.reset,
		pass: func(ctx context.Context) ([]any, error) {
			n, err := r.runOnce(ctx)
			if err != nil || n == 0 {
				return nil, err
			}
			return []any{"released", n}, nil
		},
		failed: func() { r.metrics.failures.WithLabelValues(componentReleaser).Inc() },
	}
}

// reset forgets the tasks in transit: a new leadership starts afresh.
func (r *releaser) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.transit = map[string][]released{}
	r.lastCount = time.Time{}
}

// runOnce releases what each limited kind may start now, and counts the
// parked tasks when that is due. It returns how many tasks it released.
func (r *releaser) runOnce(ctx context.Context) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.transit == nil {
		r.transit = map[string][]released{}
	}
	kinds, err := r.store.LimitedKinds(ctx)
	if err != nil {
		return 0, err
	}
	now := time.Now()
	total := 0
	releasing := make(map[string]bool, len(kinds))
	for _, kind := range kinds {
		releasing[kind] = true
		var ids []uuid.UUID
		kept := r.transit[kind][:0]
		for _, t := range r.transit[kind] {
			if now.Sub(t.at) < transitTimeout {
				kept = append(kept, t)
				ids = append(ids, t.id)
			}
		}
		inTransit, err := r.store.InTransit(ctx, ids)
		if err != nil {
			return total, err
		}
		woken, err := r.store.ReleaseParked(ctx, kind, inTransit, 0)
		if err != nil {
			return total, err
		}
		for _, id := range woken {
			kept = append(kept, released{id: id, at: now})
		}
		r.transit[kind] = kept
		total += len(woken)
	}
	for kind := range r.transit {
		if len(r.transit[kind]) == 0 {
			delete(r.transit, kind)
		}
	}
	if now.Sub(r.lastCount) >= r.cfg.WaitingInterval {
		n, err := r.countWaiting(ctx, releasing)
		total += n
		if err != nil {
			return total, err
		}
		r.lastCount = now
	}
	return total, nil
}

// strandedBatch is how many parked tasks of a kind that is neither paused
// nor limited countWaiting releases per call of ReleaseParked.
const strandedBatch = 1000

// countWaiting counts the parked tasks of every kind, by reason
// (task.ParkReason: "paused" for a paused kind, "limit" for the others),
// and releases those of kinds that are neither paused nor limited: no
// worker parks such a task, and no release would come for it (the resume,
// or the removal of the last limit, that should have released it did not
// finish: its process died, or its caller went away, between the change's
// commit and the release; or a worker parked it under a limit removed in
// the meantime). The kinds of releasing, which this pass released (kinds
// whose tasks a group's window holds back, task.Store.LimitedKinds), are
// counted as waiting for room ("limit"). It returns how many tasks it
// released.
func (r *releaser) countWaiting(ctx context.Context, releasing map[string]bool) (released int, err error) {
	parked, err := r.store.ParkedCounts(ctx)
	if err != nil {
		return 0, err
	}
	limits, err := r.store.KindLimits(ctx)
	if err != nil {
		return 0, err
	}
	snap := waitingSnapshot{at: time.Now(), counts: map[[2]string]int64{}}
	for kind, n := range parked {
		if _, held := limits[kind]; !held && releasing[kind] {
			snap.counts[[2]string{kind, task.ParkReason(false)}] = n
			continue
		}
		if _, held := limits[kind]; !held {
			// ReleaseParked reads the settings again under the kind's lock:
			// a kind paused or limited since releases what they allow.
			freed := 0
			for {
				ids, err := r.store.ReleaseParked(ctx, kind, 0, strandedBatch)
				freed += len(ids)
				if err != nil {
					return released + freed, err
				}
				if len(ids) < strandedBatch {
					break
				}
			}
			released += freed
			r.log.Warn("released the parked tasks of a kind that is neither paused nor limited", "kind", kind, "parked", n, "released", freed)
			continue
		}
		snap.counts[[2]string{kind, task.ParkReason(limits[kind].Paused)}] = n
	}
	// Kinds with settings and nothing parked are reported as 0, so that
	// a series that was high drops to 0 rather than vanishing.
	for kind, l := range limits {
		key := [2]string{kind, task.ParkReason(l.Paused)}
		if _, ok := snap.counts[key]; !ok {
			snap.counts[key] = 0
		}
	}
	r.wmu.Lock()
	r.waiting = snap
	r.wmu.Unlock()
	return released, nil
}

// waitingCollector exports ingest_kind_waiting_tasks from the releaser's
// last count while it is fresh: only the leader reports it, and a former
// leader stops reporting once its count is older than three intervals.
type waitingCollector struct {
	r    *releaser
	desc *prometheus.Desc
}

func newWaitingCollector(r *releaser) *waitingCollector {
	return &waitingCollector{r: r, desc: prometheus.NewDesc("ingest_kind_waiting_tasks",
		"Tasks parked in PostgreSQL because their kind is paused (reason=paused) or at its concurrency or rate limit (reason=limit); reported by the leader only.",
		[]string{"kind", "reason"}, nil)}
}

func (c *waitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *waitingCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.wmu.Lock()
	snap := c.r.waiting
	c.r.wmu.Unlock()
	fresh := time.Since(snap.at) < 3*c.r.cfg.WaitingInterval
	if !fresh {
		return
	}
	for k, n := range snap.counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}
