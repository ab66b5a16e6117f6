package ingest

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// Defaults of the worker (docs/ARCHITECTURE.md §5) and of its internals.
const (
	DefaultStream      = stream.DefaultStream
	DefaultGroup       = stream.DefaultGroup
	DefaultDLQ         = dlq.DefaultStream
	DefaultConcurrency = 16
	// MaxConcurrency bounds Config.Concurrency (INGEST_WORKER_CONCURRENCY).
	MaxConcurrency   = 100000
	DefaultTaskLease = 30 * time.Second
	// DefaultTaskTimeout is 0: no timeout (see Config.TaskTimeout).
	DefaultTaskTimeout     = time.Duration(0)
	DefaultShutdownTimeout = 30 * time.Second
	DefaultReclaimIdle     = reclaim.DefaultMinIdle
	DefaultBlock           = stream.DefaultBlock
	// DefaultCompleteBatch and DefaultCompleteWindow bound how many
	// outcomes the completer gathers into one store call, and for how long.
	DefaultCompleteBatch  = 64
	DefaultCompleteWindow = 2 * time.Millisecond
	// DefaultCompleteParallel is how many completer batches may be
	// committing at once.
	DefaultCompleteParallel = 4
)

// Config configures a Service: one worker process. Zero fields take the
// Default* values.
//
// The queue's identity (the stream or topic, the group, the consumer name
// and the reclaim idle time) is defined once: in Stream, Group, Consumer
// and ReclaimIdle (Redis mode), or by the Kafka configuration (Kafka
// mode: the topic and group; Stream, Group and DLQ must be left zero).
// WithDefaults passes it down to every component: the task store's
// Stream, the reclaimer's Stream, Group, Consumer, MinIdle and LeaseIdle,
// the rescuer's and the idle-consumer cleanup's stream and group, and
// retention's streams are the queue's; what is set there is replaced.
type Config struct {
	// Stream, Group: the task stream and its consumer group (Redis mode).
	Stream string
	Group  string
	// DLQ is the dead-letter stream (DefaultDLQ when ""); it needs the
	// task stream's hash tag on Redis Cluster. Kafka mode dead-letters to
	// kafka.Config.DLQTopic instead.
	DLQ string
	// NoDLQ writes no DLQ entries: a dead task's entry is only acknowledged
	// (DEAD state only). INGEST_REDIS_DLQ_STREAM_KEY="" maps to it.
	NoDLQ bool
	// Consumer is this worker's consumer name and lease owner; it must be
	// unique among live workers. Default: hostname-pid.
	Consumer string
	// Concurrency is the number of handler slots, 1..MaxConcurrency: the
	// handlers that run at once. A slot is free again once its handler has
	// returned and handed its outcome to the completer, whose queue holds
	// max(Concurrency, CompleteBatch × CompleteParallel) outcomes. While
	// handlers are short (under 50 ms on average), up to
	// min(2 × Concurrency, 256) more tasks of kinds without limits are
	// started ahead of the slots and wait for one (docs/ARCHITECTURE.md
	// §1.3).
	Concurrency int
	// TaskLease is how long a started task is held without renewal; the
	// heartbeat renews it every TaskLease/3.
	TaskLease time.Duration
	// TaskTimeout is the deadline of a handler's context for tasks without
	// a timeout of their own (timeout_ms) and of a kind without one
	// (HandlerOptions.Timeout); 0: none. See HandlerOptions for what
	// happens to a handler that ignores it.
	TaskTimeout time.Duration
	// ShutdownTimeout is how long running handlers may finish after Run's
	// context is cancelled, before they are cancelled and their tasks
	// handed back.
	ShutdownTimeout time.Duration
	// ReclaimIdle is the reclaimer's min-idle time
	// (INGEST_REDIS_RECLAIM_IDLE_MS). The worker sets the idle time of
	// entries it leaves pending relative to it, so that they become
	// claimable exactly when they should run again. time.Millisecond, the
	// least, re-drives failed entries at the next reclaim round; below the
	// heartbeat interval (TaskLease/3) the reclaimer also claims the
	// entries of running tasks and hands them back (the start guard never
	// runs a task twice), and crashed workers are found by their leases.
	ReclaimIdle time.Duration
	// Block bounds one blocking stream read (and so shutdown latency).
	Block time.Duration
	// CompleteBatch and CompleteWindow bound the completer's batches;
	// CompleteParallel is how many batches may be committing at once.
	CompleteBatch    int
	CompleteWindow   time.Duration
	CompleteParallel int
	// ReadCount is the most entries one stream read asks for (fewer when
	// fewer handler slots are free); all of them are started in one
	// statement. Default stream.DefaultCount.
	ReadCount int
	// CancelListenDisabled turns off the worker's LISTEN on
	// task.CancelChannel (for a pooler that cannot LISTEN): a cancelled
	// running task's handler is then cancelled at the next lease renewal,
	// within TaskLease/3, instead of at once.
	CancelListenDisabled bool

	// Store configures the task store the service creates (Service.Store).
	Store task.Config

	// Reclaim configures the reclaimer (Redis mode); ReclaimDisabled runs
	// none (INGEST_REDIS_RECLAIM_ENABLED=false).
	Reclaim         reclaim.Config
	ReclaimDisabled bool

	// Relay configures the outbox relay; RelayDisabled runs none. ID
	// defaults to the consumer name.
	Relay         outbox.RelayConfig
	RelayDisabled bool

	// Maintenance configures the leader election and the singleton
	// services only the leader runs. Elector.ID defaults to the consumer
	// name.
	Maintenance maintenance.Config

	// Listen says where the connections that LISTEN come from: the
	// relay's, the cancel listener's (Store.Listen) and the leader's loss
	// listener's (Maintenance.Listen), which take it. The zero value opens
	// them like the pool's connections; behind a transaction pooler set
	// Listen.Conn to a direct connection, or Listen.None to poll instead
	// (package pgsession).
	Listen pgsession.Source
}

// DefaultConsumer returns hostname-pid.
func DefaultConsumer() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// WithDefaults returns the configuration with every zero field set to its
// default (the consumer name is asked of the OS only when it is empty) and
// the queue's identity and Listen passed down to every component.
func (c Config) WithDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.Group = cmp.Or(c.Group, DefaultGroup)
	switch {
	case c.NoDLQ:
		c.DLQ = ""
	case c.DLQ == "":
		c.DLQ = DefaultDLQ
	}
	if c.Consumer == "" {
		c.Consumer = DefaultConsumer()
	}
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.CompleteBatch = cmp.Or(c.CompleteBatch, DefaultCompleteBatch)
	c.CompleteParallel = cmp.Or(c.CompleteParallel, DefaultCompleteParallel)
	c.ReadCount = cmp.Or(c.ReadCount, stream.DefaultCount)
	c.TaskLease = cmp.Or(c.TaskLease, DefaultTaskLease)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.ReclaimIdle = cmp.Or(c.ReclaimIdle, DefaultReclaimIdle)
	c.Block = cmp.Or(c.Block, DefaultBlock)
	c.CompleteWindow = cmp.Or(c.CompleteWindow, DefaultCompleteWindow)

	c.Store.Stream = c.Stream
	c.Store.Listen = c.Listen
	c.Store = c.Store.WithDefaults()

	r := &c.Reclaim
	r.Stream, r.Group, r.Consumer = c.Stream, c.Group, c.Consumer
	r.MinIdle, r.LeaseIdle = c.ReclaimIdle, c.TaskLease
	c.Reclaim = c.Reclaim.WithDefaults()

	c.Relay.ID = cmp.Or(c.Relay.ID, c.Consumer)
	c.Relay.Listen = c.Listen
	c.Relay = c.Relay.WithDefaults()

	m := &c.Maintenance
	m.Listen = c.Listen
	m.Rescuer.Stream, m.Rescuer.Group = c.Stream, c.Group
	m.Retention.Streams = []string{c.Stream}
	m.Retention.DLQ = c.DLQ // entries of deleted DEAD tasks
	m.Consumers.Stream, m.Consumers.Group, m.Consumers.Consumer = c.Stream, c.Group, c.Consumer
	m.Elector.ID = cmp.Or(m.Elector.ID, c.Consumer)
	c.Maintenance = c.Maintenance.WithDefaults()
	return c
}

// configError is a configuration error of this package: "ingest:
// <setting>: <what is wrong>".
func configError(setting, format string, args ...any) error {
	return fmt.Errorf("ingest: "+setting+": "+format, args...)
}

// Validate checks the configuration, zero fields taking their defaults:
// the worker's settings and every enabled component's configuration.
// Errors name the setting ("ingest: Config.Concurrency: ...").
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.Concurrency < 1 || c.Concurrency > MaxConcurrency:
		return configError("Config.Concurrency", "must be between 1 and %d, got %d", MaxConcurrency, c.Concurrency)
	case c.TaskLease < 3*time.Millisecond:
		return configError("Config.TaskLease", "must be >= 3ms, got %s", c.TaskLease)
	case c.TaskTimeout < 0:
		return configError("Config.TaskTimeout", "must be >= 0 (0: none), got %s", c.TaskTimeout)
	case c.ShutdownTimeout < 0:
		return configError("Config.ShutdownTimeout", "must be >= 0, got %s", c.ShutdownTimeout)
	case c.ReclaimIdle < time.Millisecond:
		return configError("Config.ReclaimIdle", "must be >= 1ms (Redis keeps idle times in whole milliseconds), got %s", c.ReclaimIdle)
	case c.CompleteBatch < 1:
		return configError("Config.CompleteBatch", "must be >= 1, got %d", c.CompleteBatch)
	case c.CompleteParallel < 1 || c.CompleteParallel > 64:
		return configError("Config.CompleteParallel", "must be between 1 and 64, got %d", c.CompleteParallel)
	case c.ReadCount < 1:
		return configError("Config.ReadCount", "must be >= 1, got %d", c.ReadCount)
	case c.CompleteWindow < 0:
		return configError("Config.CompleteWindow", "must be >= 0, got %s", c.CompleteWindow)
	case c.DLQ != "" && c.DLQ == c.Stream:
		return configError("Config.DLQ", "must differ from Stream (%q)", c.Stream)
	}
	if err := c.Store.Validate(); err != nil {
		return configError("Config.Store", "%w", err)
	}
	if !c.ReclaimDisabled {
		if err := c.Reclaim.Validate(); err != nil {
			return configError("Config.Reclaim", "%w", err)
		}
	}
	if !c.RelayDisabled {
		if err := c.Relay.Validate(); err != nil {
			return configError("Config.Relay", "%w", err)
		}
	}
	if err := c.Maintenance.Validate(); err != nil {
		return configError("Config.Maintenance", "%w", err)
	}
	return nil
}
