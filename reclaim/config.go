package reclaim

import (
	"errors"
	"fmt"
	"time"

	"github.com/ingest-worker/ingest/internal/defaults"
	"github.com/ingest-worker/ingest/stream"
)

// Defaults for Config (DESIGN §5: INGEST_REDIS_RECLAIM_*).
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
	// DefaultBatchSize is XAUTOCLAIM's COUNT
	// (INGEST_REDIS_RECLAIM_BATCH_SIZE).
	DefaultBatchSize = 20
	// DefaultConsumerIdleTimeout is how long a consumer with nothing pending
	// may stay idle before it is removed from the group.
	DefaultConsumerIdleTimeout = time.Hour
	// DefaultConsumerCheckInterval is how often idle consumers are looked for.
	DefaultConsumerCheckInterval = time.Minute
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
	// pending entries, and it is never removed by the consumer hygiene.
	// Required.
	Consumer string
	// Interval is the time between two rounds. A due retry runs at most
	// about one Interval after it falls due.
	Interval time.Duration
	// MinIdle is the idle time after which a pending entry is claimed: the
	// time after which a silent worker is taken for dead. It must be well
	// above the heartbeat period of the consumers.
	MinIdle time.Duration
	// BatchSize is the most entries claimed with one XAUTOCLAIM (its COUNT),
	// 1..MaxBatchSize. Fewer are claimed when the Sink has fewer free slots.
	BatchSize int
	// ConsumerIdleTimeout is how long a consumer with no pending entries may
	// stay idle (XINFO CONSUMERS idle) before it is removed from the group.
	ConsumerIdleTimeout time.Duration
	// ConsumerCheckInterval is the least time between two looks for idle
	// consumers (XINFO CONSUMERS is O(consumers), so not every round).
	ConsumerCheckInterval time.Duration
}

func (c *Config) setDefaults() {
	defaults.Set(&c.Stream, DefaultStream)
	defaults.Set(&c.Group, DefaultGroup)
	defaults.Set(&c.Interval, DefaultInterval)
	defaults.Set(&c.MinIdle, DefaultMinIdle)
	defaults.Set(&c.BatchSize, DefaultBatchSize)
	defaults.Set(&c.ConsumerIdleTimeout, DefaultConsumerIdleTimeout)
	defaults.Set(&c.ConsumerCheckInterval, DefaultConsumerCheckInterval)
}

// Validate checks a configuration (with defaults applied) and names the bad
// field.
func (c Config) Validate() error {
	switch {
	case c.Stream == "":
		return errors.New("field Stream must not be empty")
	case c.Group == "":
		return errors.New("field Group must not be empty")
	case c.Consumer == "":
		return errors.New("field Consumer must not be empty (this process's consumer name)")
	case c.Interval <= 0:
		return fmt.Errorf("field Interval must be > 0, got %s", c.Interval)
	case c.MinIdle < time.Millisecond:
		return fmt.Errorf("MinIdle must be >= 1ms, got %s", c.MinIdle)
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return fmt.Errorf("BatchSize must be between 1 and %d, got %d", MaxBatchSize, c.BatchSize)
	case c.ConsumerIdleTimeout < time.Millisecond:
		return fmt.Errorf("ConsumerIdleTimeout must be >= 1ms, got %s", c.ConsumerIdleTimeout)
	case c.ConsumerCheckInterval <= 0:
		return fmt.Errorf("ConsumerCheckInterval must be > 0, got %s", c.ConsumerCheckInterval)
	}
	return nil
}
