package maintenance

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ingest-worker/ingest/internal/configerr"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// ErrConfig is wrapped by every configuration error of this package; the
// message names the bad field.
var ErrConfig = errors.New("invalid maintenance config")

// configErr is the error of a bad field of Config, in the form package
// configerr owns: "maintenance: Elector.TTL: must be ...".
func configErr(setting, format string, args ...any) error {
	return configerr.New("maintenance", ErrConfig, setting, format, args...)
}

// Config configures a Maintainer: the leader election and each singleton
// service. Zero fields take the Default* values; a service whose Disabled
// flag is set is not run.
type Config struct {
	// Elector configures the leader election.
	Elector ElectorConfig

	// Listen is where the leader's connection that LISTENs for Redis loss
	// reports comes from (the zero value: a connection like the pool's).
	// With Listen.None the leader does not listen: a loss its own consumer
	// or reclaimer sees still starts an urgent rescue, one only another
	// process saw is rescued after the grace.
	Listen pgsession.Source

	// Rescuer configures the rescuer; RescuerDisabled runs none.
	Rescuer         RescuerConfig
	RescuerDisabled bool

	// Retention configures outbox retention and stream trimming;
	// RetentionDisabled runs none.
	Retention         RetentionConfig
	RetentionDisabled bool

	// Partitions configures the partitions of the audit table and of the
	// outbox (created ahead, dropped once no longer written to, the rows
	// of the tasks that still exist moved out first);
	// PartitionsDisabled runs none (then the rows beyond the partitions
	// created ahead land in the DEFAULT partitions, and retention's
	// deleted tasks leave their audit and outbox rows behind).
	Partitions         PartitionsConfig
	PartitionsDisabled bool

	// LowWater configures the raise of the low water of the unfinished
	// tasks (lowwater.go); LowWaterDisabled runs none (then every task
	// stays "recent", and the readers of the unfinished tasks read every
	// task created since the low water was last raised: correct, slower).
	LowWater         LowWaterConfig
	LowWaterDisabled bool

	// Consumers configures the idle-consumer cleanup; ConsumersDisabled
	// runs none.
	Consumers         ConsumersConfig
	ConsumersDisabled bool

	// Periodic configures the periodic tasks; the service runs while it
	// has schedules.
	Periodic PeriodicConfig

	// Releaser configures the releaser of parked tasks of limited kinds;
	// ReleaserDisabled runs none (then a kind's tasks parked at a rate
	// limit, or at a concurrency limit whose slots an expired lease
	// freed, wait for a finished run of the kind or a change of its
	// settings). The count of blocked sequences for
	// ingest_sequences_blocked runs with the releaser, every
	// Releaser.WaitingInterval.
	Releaser         ReleaserConfig
	ReleaserDisabled bool
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c Config) WithDefaults() Config {
	c.Elector = c.Elector.WithDefaults()
	c.Rescuer = c.Rescuer.WithDefaults()
	c.Retention = c.Retention.WithDefaults()
	c.Partitions = c.Partitions.WithDefaults()
	c.LowWater = c.LowWater.WithDefaults()
	c.Consumers = c.Consumers.WithDefaults()
	c.Periodic = c.Periodic.WithDefaults()
	c.Releaser = c.Releaser.WithDefaults()
	if s, err := validateSchedules(c.Periodic.Schedules, "Periodic.Schedules"); err == nil {
		c.Periodic.Schedules = s // parsed, for Schedule.Next
	}
	return c
}

// Validate checks the configuration (zero fields taking their defaults)
// and names the bad field. Disabled services are not checked.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if err := c.Elector.validate(); err != nil {
		return err
	}
	if !c.RescuerDisabled {
		if err := c.Rescuer.validate(); err != nil {
			return err
		}
	}
	if !c.RetentionDisabled {
		if err := c.Retention.validate(); err != nil {
			return err
		}
	}
	if !c.PartitionsDisabled {
		if err := c.Partitions.validate(); err != nil {
			return err
		}
	}
	if !c.LowWaterDisabled {
		if err := c.LowWater.validate(); err != nil {
			return err
		}
	}
	if !c.ConsumersDisabled {
		if err := c.Consumers.validate(); err != nil {
			return err
		}
	}
	if !c.ReleaserDisabled {
		if err := c.Releaser.validate(); err != nil {
			return err
		}
	}
	return c.Periodic.validate()
}

// Leader election defaults: a leader that dies is replaced within about
// DefaultTTL + DefaultRetryInterval.
const (
	// DefaultLeaderName is the leader row the maintainers of one database
	// elect their leader in (ingest_leader.name).
	DefaultLeaderName = "maintenance"
	// DefaultTTL is the leader's lease: ingest_leader.expires_at is set to
	// now() + TTL by each renewal.
	DefaultTTL = 3 * time.Second
	// DefaultRetryInterval is how often a follower tries to become leader.
	DefaultRetryInterval = time.Second
)

// ElectorConfig configures the leader election. Zero fields take their
// defaults.
type ElectorConfig struct {
	// Name is the election: maintainers with the same Name on one database
	// elect one leader (the row of ingest_leader with this name).
	Name string
	// ID names this process in ingest_leader.leader_id (default:
	// hostname-pid). A random suffix is added, so that two electors never
	// share an identity.
	ID string
	// TTL is the lease a successful acquire or renewal gives, from the
	// database's now(). Default DefaultTTL.
	TTL time.Duration
	// RenewInterval is the time between two renewals by the leader.
	// Default TTL/3.
	RenewInterval time.Duration
	// RetryInterval is the time between two attempts of a follower to
	// become leader. Default DefaultRetryInterval.
	RetryInterval time.Duration
	// Margin is how long before its lease could expire in the database the
	// leader stops its services when it could not renew it: its local
	// deadline is the time it sent its last successful renewal plus
	// TTL - Margin, measured on its own monotonic clock. Default TTL/3.
	Margin time.Duration
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c ElectorConfig) WithDefaults() ElectorConfig {
	c.Name = cmp.Or(c.Name, DefaultLeaderName)
	c.ID = cmp.Or(c.ID, defaultID())
	c.TTL = cmp.Or(c.TTL, DefaultTTL)
	c.RenewInterval = cmp.Or(c.RenewInterval, c.TTL/3)
	c.RetryInterval = cmp.Or(c.RetryInterval, DefaultRetryInterval)
	c.Margin = cmp.Or(c.Margin, c.TTL/3)
	return c
}

func (c ElectorConfig) validate() error {
	switch {
	case c.Name == "":
		return configErr("Elector.Name", "is required")
	case c.TTL < 10*time.Millisecond:
		return configErr("Elector.TTL", "must be at least 10ms, got %s", c.TTL)
	case c.Margin <= 0 || c.Margin >= c.TTL:
		return configErr("Elector.Margin", "must be more than 0s and less than TTL (%s), got %s", c.TTL, c.Margin)
	case c.RenewInterval <= 0 || c.RenewInterval >= c.TTL-c.Margin:
		return configErr("Elector.RenewInterval", "must be more than 0s and less than TTL - Margin (%s), got %s", c.TTL-c.Margin, c.RenewInterval)
	case c.RetryInterval <= 0:
		return configErr("Elector.RetryInterval", "must be more than 0s, got %s", c.RetryInterval)
	}
	return nil
}

func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// Rescuer defaults.
const (
	DefaultRescueInterval    = 30 * time.Second
	DefaultRescueBatchSize   = 100
	DefaultRescuePagesPerRun = 10
	DefaultRescueGrace       = time.Minute
)

// RescuerConfig configures the rescuer. Zero fields take the Default*
// values.
type RescuerConfig struct {
	// Stream is where a task that has no outbox row at all is republished
	// (INGEST_REDIS_STREAM_KEY). Other tasks go back to the stream of their
	// latest outbox row.
	Stream string
	// Group is the consumer group whose delivery state tells whether an
	// entry is still on its way to a worker (INGEST_REDIS_GROUP).
	Group string
	// Interval is the period of the passes.
	Interval time.Duration
	// BatchSize is how many candidate tasks one page examines: one indexed
	// query and one pipelined Redis round trip.
	BatchSize int
	// PagesPerRun bounds the pages one pass examines per kind of candidate
	// (QUEUED, RETRYING, RUNNING with an expired lease). The pass goes on
	// where the previous one stopped (keyset), and starts over at the end.
	PagesPerRun int
	// Grace is how long after its latest outbox row was SENT a task is left
	// alone, so the rescuer never races a fresh publish or delivery.
	Grace time.Duration
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c RescuerConfig) WithDefaults() RescuerConfig {
	c.Stream = cmp.Or(c.Stream, stream.DefaultStream)
	c.Group = cmp.Or(c.Group, stream.DefaultGroup)
	c.Interval = cmp.Or(c.Interval, DefaultRescueInterval)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultRescueBatchSize)
	c.PagesPerRun = cmp.Or(c.PagesPerRun, DefaultRescuePagesPerRun)
	c.Grace = cmp.Or(c.Grace, DefaultRescueGrace)
	return c
}

func (c RescuerConfig) validate() error {
	switch {
	case c.Interval < time.Millisecond:
		return configErr("Rescuer.Interval", "must be at least 1ms, got %s", c.Interval)
	case c.BatchSize < 1 || c.BatchSize > 10000:
		return configErr("Rescuer.BatchSize", "must be from 1 to 10000, got %d", c.BatchSize)
	case c.PagesPerRun < 1:
		return configErr("Rescuer.PagesPerRun", "must be at least 1, got %d", c.PagesPerRun)
	case c.Grace < 0:
		return configErr("Rescuer.Grace", "must be at least 0s, got %s", c.Grace)
	}
	return nil
}

// Retention defaults.
const (
	DefaultRetentionInterval  = time.Minute
	DefaultRetentionBatchSize = 1000

	// Finished tasks are kept this long after finished_at, by state.
	DefaultRetentionSucceeded = 24 * time.Hour
	DefaultRetentionCancelled = 24 * time.Hour
	DefaultRetentionDead      = 168 * time.Hour
)

// RetentionConfig configures the retention of finished tasks and stream
// trimming (the audit and outbox rows go with their partitions:
// PartitionsConfig). Zero fields take the Default* values.
type RetentionConfig struct {
	// Tasks are how long finished tasks are kept after finished_at, by
	// state (zero: DefaultRetentionSucceeded, DefaultRetentionCancelled,
	// DefaultRetentionDead; task.KeepForever: never deleted). An expired
	// task goes with its task-stream entries, a DEAD one with its entry in
	// the DLQ stream; its audit and outbox rows go with their partitions
	// (PartitionsConfig).
	Tasks task.Windows
	// DLQ is the dead-letter stream the entries of deleted DEAD tasks are
	// removed from ("": none, as with the DLQ in Kafka).
	DLQ string
	// Interval is the period of the passes.
	Interval time.Duration
	// BatchSize is how many tasks one DELETE removes; each is its own
	// short transaction.
	BatchSize int
	// Streams are the task streams to trim (default: the default stream),
	// each with the streams of its other priorities (stream.Keys).
	Streams []string
	// DisableTrim leaves the streams alone (rows are still deleted).
	DisableTrim bool
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c RetentionConfig) WithDefaults() RetentionConfig {
	c.Tasks.Succeeded = cmp.Or(c.Tasks.Succeeded, DefaultRetentionSucceeded)
	c.Tasks.Cancelled = cmp.Or(c.Tasks.Cancelled, DefaultRetentionCancelled)
	c.Tasks.Dead = cmp.Or(c.Tasks.Dead, DefaultRetentionDead)
	c.Interval = cmp.Or(c.Interval, DefaultRetentionInterval)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultRetentionBatchSize)
	if len(c.Streams) == 0 {
		c.Streams = []string{stream.DefaultStream}
	}
	return c
}

func (c RetentionConfig) validate() error {
	switch {
	case c.Tasks.Succeeded < 0 && c.Tasks.Succeeded != task.KeepForever:
		return configErr("Retention.Tasks.Succeeded", "must be more than 0s or task.KeepForever, got %s", c.Tasks.Succeeded)
	case c.Tasks.Cancelled < 0 && c.Tasks.Cancelled != task.KeepForever:
		return configErr("Retention.Tasks.Cancelled", "must be more than 0s or task.KeepForever, got %s", c.Tasks.Cancelled)
	case c.Tasks.Dead < 0 && c.Tasks.Dead != task.KeepForever:
		return configErr("Retention.Tasks.Dead", "must be more than 0s or task.KeepForever, got %s", c.Tasks.Dead)
	case c.Interval < time.Millisecond:
		return configErr("Retention.Interval", "must be at least 1ms, got %s", c.Interval)
	case c.BatchSize < 1 || c.BatchSize > 100000:
		return configErr("Retention.BatchSize", "must be from 1 to 100000, got %d", c.BatchSize)
	}
	for i, s := range c.Streams {
		if s == "" {
			return configErr(fmt.Sprintf("Retention.Streams[%d]", i), "is empty")
		}
	}
	return nil
}

// Partition defaults: daily partitions, two days ahead, checked every
// minute; a past partition is dropped when at most 10,000 of its rows
// belong to tasks that still exist (they move to the DEFAULT partition);
// an outbox partition holds at least 10,000 ids.
const (
	DefaultPartitionWidth        = 24 * time.Hour
	DefaultPartitionAhead        = 48 * time.Hour
	DefaultPartitionInterval     = time.Minute
	DefaultPartitionLockTimeout  = time.Second
	DefaultPartitionKeepMax      = 10000
	DefaultPartitionOutboxMinIDs = 10000
)

// PartitionsConfig configures the leader's upkeep of the partitions of
// the audit table and of the outbox (partitions.go). Zero fields take the
// Default* values.
type PartitionsConfig struct {
	// Width is the time range of each partition created (from the end of
	// the newest one: a change applies to the partitions created after
	// it); an outbox partition holds the ids Width of time took, at the
	// rate of the last Width. A partition is dropped whole, so Width is
	// the grain of retention: a row stays up to Width longer than its
	// task.
	Width time.Duration
	// Ahead is how far past now the partitions reach after each pass.
	Ahead time.Duration
	// Interval is the period of the passes.
	Interval time.Duration
	// LockTimeout bounds the wait of each DDL statement for its lock
	// (ATTACH, DROP), and so how long writers of audit or outbox rows
	// can wait behind it; a statement that times out is retried at the
	// next pass.
	LockTimeout time.Duration
	// KeepMax is the most rows of tasks that still exist a past
	// partition may hold and still be dropped: they are moved into the
	// DEFAULT partition first. A partition with more stays until enough
	// of its tasks are gone.
	KeepMax int
	// OutboxMinIDs is the fewest ids an outbox partition holds, however
	// slowly ids are taken.
	OutboxMinIDs int
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c PartitionsConfig) WithDefaults() PartitionsConfig {
	c.Width = cmp.Or(c.Width, DefaultPartitionWidth)
	c.Ahead = cmp.Or(c.Ahead, DefaultPartitionAhead)
	c.Interval = cmp.Or(c.Interval, DefaultPartitionInterval)
	c.LockTimeout = cmp.Or(c.LockTimeout, DefaultPartitionLockTimeout)
	c.KeepMax = cmp.Or(c.KeepMax, DefaultPartitionKeepMax)
	c.OutboxMinIDs = cmp.Or(c.OutboxMinIDs, DefaultPartitionOutboxMinIDs)
	return c
}

func (c PartitionsConfig) validate() error {
	switch {
	case c.Width < time.Minute:
		return configErr("Partitions.Width", "must be at least 1m, got %s", c.Width)
	case c.Ahead < c.Interval:
		return configErr("Partitions.Ahead", "must be at least Partitions.Interval (%s), got %s", c.Interval, c.Ahead)
	case c.Interval < time.Millisecond:
		return configErr("Partitions.Interval", "must be at least 1ms, got %s", c.Interval)
	case c.LockTimeout < time.Millisecond:
		return configErr("Partitions.LockTimeout", "must be at least 1ms, got %s", c.LockTimeout)
	case c.KeepMax < 0:
		return configErr("Partitions.KeepMax", "must not be negative, got %d", c.KeepMax)
	case c.OutboxMinIDs < 1:
		return configErr("Partitions.OutboxMinIDs", "must be at least 1, got %d", c.OutboxMinIDs)
	}
	return nil
}

// Low-water defaults: a pass every 2 s, a cutoff a minute back, up to
// 1000 finished tasks cleared of lingering a pass. The rescuer's pages
// read the tasks from the low water up to those created a grace ago
// (DefaultRescueGrace, equal to the lag): about an Interval of tasks, one
// or two passes' worth. While a transaction is held open, each of them
// costs every row version it has had since, so that range is kept short:
// under a five-minute hold, a page's p99 was 408 ms with 10 s (beside
// other costs since removed), 160 ms with 2 s.
const (
	DefaultLowWaterInterval   = 2 * time.Second
	DefaultLowWaterLag        = time.Minute
	DefaultLowWaterClearBatch = 1000
)

// LowWaterConfig configures the leader's raise of the low water of the
// unfinished tasks (lowwater.go). Zero fields take the Default* values.
type LowWaterConfig struct {
	// Interval is the period of the passes.
	Interval time.Duration
	// Lag is how far behind the database's now() each cutoff is. A task
	// still unfinished when the low water passes its id is marked
	// lingering, which costs it two updates that are not HOT (the mark,
	// and the clear after it finished): Lag should exceed how long most
	// tasks take from creation to their end. The readers of the
	// unfinished tasks read every task of about the last Lag + Interval
	// on the primary key, finished or not.
	Lag time.Duration
	// ClearBatch bounds how many finished tasks a pass clears of lingering.
	ClearBatch int
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c LowWaterConfig) WithDefaults() LowWaterConfig {
	c.Interval = cmp.Or(c.Interval, DefaultLowWaterInterval)
	c.Lag = cmp.Or(c.Lag, DefaultLowWaterLag)
	c.ClearBatch = cmp.Or(c.ClearBatch, DefaultLowWaterClearBatch)
	return c
}

func (c LowWaterConfig) validate() error {
	switch {
	case c.Interval < time.Millisecond:
		return configErr("LowWater.Interval", "must be at least 1ms, got %s", c.Interval)
	case c.Lag < time.Millisecond:
		return configErr("LowWater.Lag", "must be at least 1ms, got %s", c.Lag)
	case c.ClearBatch < 1:
		return configErr("LowWater.ClearBatch", "must be at least 1, got %d", c.ClearBatch)
	}
	return nil
}

// Idle-consumer cleanup defaults.
const (
	// DefaultConsumerIdleTimeout is how long a consumer with nothing pending
	// may stay idle before it is removed from the group.
	DefaultConsumerIdleTimeout = time.Hour
	// DefaultConsumerCheckInterval is how often idle consumers are looked for.
	DefaultConsumerCheckInterval = time.Minute
)

// ConsumersConfig configures the idle-consumer cleanup. Zero fields take
// the Default* values.
type ConsumersConfig struct {
	// Stream and Group are the consumer group whose consumers are cleaned.
	Stream string
	Group  string
	// Consumer is this process's own consumer name, never removed ("":
	// none is spared).
	Consumer string
	// IdleTimeout is how long a consumer with no pending entries may stay
	// idle (XINFO CONSUMERS idle) before it is removed from the group.
	IdleTimeout time.Duration
	// Interval is the time between two looks for idle consumers (XINFO
	// CONSUMERS is O(consumers)).
	Interval time.Duration
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c ConsumersConfig) WithDefaults() ConsumersConfig {
	c.Stream = cmp.Or(c.Stream, stream.DefaultStream)
	c.Group = cmp.Or(c.Group, stream.DefaultGroup)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultConsumerIdleTimeout)
	c.Interval = cmp.Or(c.Interval, DefaultConsumerCheckInterval)
	return c
}

func (c ConsumersConfig) validate() error {
	switch {
	case c.IdleTimeout < time.Millisecond:
		return configErr("Consumers.IdleTimeout", "must be at least 1ms, got %s", c.IdleTimeout)
	case c.Interval < time.Millisecond:
		return configErr("Consumers.Interval", "must be at least 1ms, got %s", c.Interval)
	}
	return nil
}
