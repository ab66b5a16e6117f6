package reclaim

import (
	"cmp"
	"time"

	"github.com/ingest-worker/ingest/internal/configerr"
	"github.com/ingest-worker/ingest/stream"
)

// Defaults for Config (docs/ARCHITECTURE.md §5: INGEST_REDIS_RECLAIM_*).
const (
	// DefaultStream is the task stream (contract).
	DefaultStream = stream.DefaultStream
	// DefaultGroup is the consumer group (contract).
	DefaultGroup = stream.DefaultGroup
	// DefaultInterval is the time between rounds
	// (INGEST_REDIS_RECLAIM_INTERVAL_MS).
	DefaultInterval = 5 * time.Second
	// DefaultMinIdle is the crash-detection idle time
	// (INGEST_REDIS_RECLAIM_IDLE_MS).
	DefaultMinIdle = 10 * time.Minute
	// DefaultLeaseIdle is the task lease of a worker with the defaults
	// (INGEST_TASK_LEASE_MS): see Config.LeaseIdle.
	DefaultLeaseIdle = 30 * time.Second
	// DefaultBatchSize is XAUTOCLAIM's COUNT
	// (INGEST_REDIS_RECLAIM_BATCH_SIZE).
	DefaultBatchSize = 20
	// MaxBatchSize bounds Config.BatchSize.
	MaxBatchSize = 10000
)

// Config configures a Reclaimer. Zero fields take the Default* values,
// except Consumer, which is required.
type Config struct {
	// Stream is the task stream key.
	Stream string
	// Group is the consumer group that reads Stream.
	Group string
	// Consumer is this process's consumer name: claimed entries become its
	// pending entries. Required.
	Consumer string
	// Interval is the time between two rounds. A due retry runs at most
	// about one Interval after it falls due.
	Interval time.Duration
	// MinIdle is the idle time after which a pending entry is claimed: the
	// time after which a silent worker is taken for dead. It must be well
	// above the heartbeat period of the consumers.
	MinIdle time.Duration
	// LeaseIdle is the task lease of the workers (INGEST_TASK_LEASE_MS):
	// a pending entry idle for at least LeaseIdle, held by a consumer that
	// has not been heard from for as long, whose task is RUNNING under a
	// lease that expired, is taken over without waiting for MinIdle (see
	// the package documentation). It must be well above the heartbeat
	// period of the consumers (a third of their lease). With LeaseIdle >=
	// MinIdle, XAUTOCLAIM alone takes such entries over.
	LeaseIdle time.Duration
	// BatchSize is the most entries claimed with one XAUTOCLAIM (its COUNT),
	// 1..MaxBatchSize. Fewer are claimed when the Sink has fewer free slots.
	BatchSize int
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c Config) WithDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.Group = cmp.Or(c.Group, DefaultGroup)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.MinIdle = cmp.Or(c.MinIdle, DefaultMinIdle)
	c.LeaseIdle = cmp.Or(c.LeaseIdle, DefaultLeaseIdle)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	return c
}

// Validate checks the configuration, zero fields taking their defaults,
// and names the bad field: "reclaim: MinIdle: must be at least 1ms, got
// 0s".
func (c Config) Validate() error {
	c = c.WithDefaults()
	bad := func(setting, format string, args ...any) error {
		return configerr.New("reclaim", nil, setting, format, args...)
	}
	switch {
	case c.Stream == "":
		return bad("Stream", "is required")
	case c.Group == "":
		return bad("Group", "is required")
	case c.Consumer == "":
		return bad("Consumer", "is required (this process's consumer name)")
	case c.Interval <= 0:
		return bad("Interval", "must be more than 0s, got %s", c.Interval)
	case c.MinIdle < time.Millisecond:
		return bad("MinIdle", "must be at least 1ms, got %s", c.MinIdle)
	case c.LeaseIdle < time.Millisecond:
		return bad("LeaseIdle", "must be at least 1ms, got %s", c.LeaseIdle)
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return bad("BatchSize", "must be from 1 to %d, got %d", MaxBatchSize, c.BatchSize)
	}
	return nil
}
