package kafka

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ingest-worker/ingest/internal/configerr"
)

// Defaults (docs/ARCHITECTURE.md §5: KAFKA_BOOTSTRAP_SERVERS, INGEST_KAFKA_*).
const (
	DefaultTopic    = "ingest.tasks"
	DefaultGroup    = "ingest-workers"
	DefaultDLQTopic = "ingest.tasks.dlq"
	// DefaultProduceTimeout bounds one ProduceSync: a broker that cannot
	// be reached fails the publish attempt instead of hanging.
	DefaultProduceTimeout = 5 * time.Second
	// DefaultRedeliverDelay is when a record whose outcome could not be
	// recorded (Postgres unreachable) is handed to the Sink again.
	DefaultRedeliverDelay = 5 * time.Second
	// DefaultCommitInterval bounds how long a settled offset waits before
	// it is committed.
	DefaultCommitInterval = 100 * time.Millisecond
)

// ErrConfig is wrapped by every configuration error of this package.
var ErrConfig = errors.New("invalid kafka config")

// Config configures the clients of Kafka mode.
type Config struct {
	// Brokers are the bootstrap servers (KAFKA_BOOTSTRAP_SERVERS).
	Brokers []string
	// Topic is the task topic (INGEST_KAFKA_TOPIC).
	Topic string
	// Group is the workers' consumer group (INGEST_KAFKA_GROUP).
	Group string
	// DLQTopic is the dead-letter topic (INGEST_KAFKA_DLQ_TOPIC); NoDLQ
	// writes none (the variable set to "").
	DLQTopic string
	NoDLQ    bool
	// ClientID names the client to the brokers (the consumer name).
	ClientID string
	// ProduceTimeout bounds one produce call.
	ProduceTimeout time.Duration
	// RedeliverDelay and CommitInterval: see the defaults.
	RedeliverDelay time.Duration
	CommitInterval time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.Topic = cmp.Or(c.Topic, DefaultTopic)
	c.Group = cmp.Or(c.Group, DefaultGroup)
	if c.NoDLQ {
		c.DLQTopic = ""
	} else {
		c.DLQTopic = cmp.Or(c.DLQTopic, DefaultDLQTopic)
	}
	c.ProduceTimeout = cmp.Or(c.ProduceTimeout, DefaultProduceTimeout)
	c.RedeliverDelay = cmp.Or(c.RedeliverDelay, DefaultRedeliverDelay)
	c.CommitInterval = cmp.Or(c.CommitInterval, DefaultCommitInterval)
	return c
}

// configErr is the error of a bad field of Config, in the form package
// configerr owns: "kafka: Brokers: must name ...".
func configErr(setting, format string, args ...any) error {
	return configerr.New("kafka", ErrConfig, setting, format, args...)
}

// Validate checks c (zero fields taking their defaults) and names the bad
// field: "kafka: ProduceTimeout: must be at least 1ms, got 0s". The errors
// wrap ErrConfig.
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case len(c.Brokers) == 0:
		return configErr("Brokers", "must name at least one broker (KAFKA_BOOTSTRAP_SERVERS)")
	case c.DLQTopic != "" && c.DLQTopic == c.Topic:
		return configErr("DLQTopic", "must differ from Topic (%q)", c.Topic)
	case c.ProduceTimeout < time.Millisecond:
		return configErr("ProduceTimeout", "must be at least 1ms, got %s", c.ProduceTimeout)
	case c.RedeliverDelay <= 0:
		return configErr("RedeliverDelay", "must be more than 0s, got %s", c.RedeliverDelay)
	case c.CommitInterval <= 0:
		return configErr("CommitInterval", "must be more than 0s, got %s", c.CommitInterval)
	}
	for i, b := range c.Brokers {
		if b == "" {
			return configErr(fmt.Sprintf("Brokers[%d]", i), "is empty")
		}
	}
	return nil
}

// clientOpts are the options every client of c gets.
func (c Config) clientOpts() []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		// franz-go's floor for the delivery timeout is a second; the
		// Publisher's context bounds each call to ProduceTimeout.
		kgo.RecordDeliveryTimeout(max(c.ProduceTimeout, time.Second)),
		kgo.AllowAutoTopicCreation(),
		// A client whose brokers were unreachable looks for them again
		// within a second once they are back (franz-go's default: 5s).
		kgo.MetadataMinAge(time.Second),
	}
	if c.ClientID != "" {
		opts = append(opts, kgo.ClientID(c.ClientID))
	}
	return opts
}

// NewProducerClient returns a client for publishing (no group); extra
// options come last.
func NewProducerClient(cfg Config, extra ...kgo.Opt) (*kgo.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	cl, err := kgo.NewClient(append(cfg.clientOpts(), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}
