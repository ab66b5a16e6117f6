package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/httpguard"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/webhook"
)

// Config is the resolved configuration of one invocation: every setting of
// docs/ARCHITECTURE.md §5, from flags, the environment and defaults (in
// that order of precedence).
type Config struct {
	DatabaseURL string
	RedisURL    string
	// RedisCluster: RedisURL names Redis Cluster nodes (INGEST_REDIS_CLUSTER).
	RedisCluster bool

	StreamKey    string
	Group        string
	DLQStreamKey string // "": no DLQ stream, DEAD state only

	MaxAttempts      int
	RetryBaseBackoff time.Duration
	RetryMaxBackoff  time.Duration
	MaxPayloadBytes  int
	MaxResultBytes   int

	// Keyring encrypts payloads and results at rest
	// (INGEST_ENCRYPTION_KEYS); nil: none.
	Keyring *seal.Keyring

	ReclaimEnabled   bool
	ReclaimInterval  time.Duration
	ReclaimIdle      time.Duration
	ReclaimBatchSize int

	OutboxMaxAttempts      int
	OutboxRetryBaseBackoff time.Duration
	OutboxRetryMaxBackoff  time.Duration
	OutboxPublishBatchSize int
	OutboxPublishInterval  time.Duration
	WorkerConcurrency      int
	ConsumerName           string
	TaskLease              time.Duration
	TaskTimeout            time.Duration
	ShutdownTimeout        time.Duration
	HTTPAddr               string // "": no HTTP server
	HTTPAllowedHosts       string // INGEST_HTTP_ALLOWED_HOSTS: names besides httpguard.DefaultHosts of HTTPAddr
	APIToken               string
	UIReadOnly             bool // INGEST_UI_READONLY
	WebhookURL             string
	WebhookTimeout         time.Duration
	WebhookBatchMax        int           // INGEST_WEBHOOK_BATCH_MAX: tasks per POST (1: one POST per task)
	WebhookBatchWait       time.Duration // INGEST_WEBHOOK_BATCH_WAIT_MS
	Periodic               string        // INGEST_PERIODIC, validated JSON (see periodic)
	// Retention windows of finished tasks by state (INGEST_RETENTION_*;
	// 0: kept forever).
	RetentionSucceeded      time.Duration
	RetentionCancelled      time.Duration
	RetentionDead           time.Duration
	LogLevel                slog.Level
	LogFormat               string // text or json
	consumerNameFromDefault bool

	// Queue is the transport: queueRedis or queueKafka (INGEST_QUEUE).
	Queue                 string
	KafkaBrokers          string // comma-separated host:port
	KafkaTopic            string
	KafkaGroup            string
	KafkaDLQTopic         string // "": no DLQ topic, DEAD state only
	KafkaMaxAttempts      int
	KafkaRetryBaseBackoff time.Duration
	KafkaRetryMaxBackoff  time.Duration
	KafkaPublishBatchSize int
	KafkaPublishInterval  time.Duration

	// DatabaseListenURL: a direct connection for what needs a session
	// (LISTEN, the migration lock) when DatabaseURL is a pooler's.
	DatabaseListenURL string // INGEST_DATABASE_LISTEN_URL
}

// scope says which commands carry a setting's flag and which commands an
// invalid value of it stops. Every setting is read from the environment by
// every command.
type scope int

const (
	// scopeGlobal: a persistent flag of the root command; every command
	// uses it, and an invalid value stops every command.
	scopeGlobal scope = iota
	// scopeWorker: a flag of the commands that run a worker (run, demo).
	// An invalid value stops the workerCommands and the commands of the
	// setting's alsoFor; any other command does not use it, warns and goes
	// on with the default, so that a bad INGEST_PERIODIC does not stop
	// 'task list'.
	scopeWorker
)

// workerCommands use every setting: they run a worker or the HTTP server
// (run, demo, ui), read the periodic schedules (periodic), or show and
// check every setting (config).
var workerCommands = map[string]bool{"run": true, "demo": true, "ui": true, "periodic": true, "config": true}

// usedBy reports whether the command at path ("task list"; "" when no
// command is known) uses s, so that an invalid value of s must stop it.
func (s setting) usedBy(path string) bool {
	if s.scope == scopeGlobal || path == "" || workerCommands[path] {
		return true
	}
	for _, p := range s.alsoFor {
		if p == path || strings.HasPrefix(path, p+" ") {
			return true
		}
	}
	return false
}

// setting is one configuration variable with its flag.
type setting struct {
	env   string
	def   string // the default as text
	typ   string // the value's type as shown in --help
	usage string
	// long is the setting's description in the configuration reference
	// (docs/CONFIGURATION.md, Markdown) when it says more than usage.
	long  string
	scope scope
	// alsoFor lists the commands ("task show", or "task" for all its
	// subcommands) that use this worker setting besides workerCommands.
	alsoFor []string
	// emptyMeansEmpty: an empty value is a value (not "use the default").
	emptyMeansEmpty bool
	// secret: the value is a secret or may contain one (a URL with a
	// password); it is shown redacted.
	secret bool
	set    func(c *Config, v string) error
}

// flagName derives the flag from the variable: INGEST_REDIS_URL → redis-url.
func (s setting) flagName() string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.env, "INGEST_")), "_", "-")
}

// settings lists every setting, in the order of the configuration
// reference: docs/CONFIGURATION.md is generated from it and settingGroups
// (TestGeneratedReferences), and docs/ARCHITECTURE.md §5 follows it.
var settings = []setting{
	{env: "INGEST_DATABASE_URL", typ: "url", scope: scopeGlobal, secret: true, emptyMeansEmpty: true,
		usage: "PostgreSQL URL or key=value DSN (empty: the standard PG* variables apply)",
		long:  "PostgreSQL URL or key=value DSN; empty: the standard `PG*` variables apply",
		set:   func(c *Config, v string) error { c.DatabaseURL = v; return checkDatabaseURL(v) }},
	{env: "INGEST_DATABASE_LISTEN_URL", typ: "url", scope: scopeGlobal, secret: true, emptyMeansEmpty: true,
		usage: "direct PostgreSQL connection (not through a pooler) for LISTEN and the migration lock, when INGEST_DATABASE_URL goes through a transaction-pooling PgBouncer (empty: LISTEN on INGEST_DATABASE_URL, or poll behind a pooler)",
		long:  "a direct PostgreSQL connection to the same database, for what needs a session when `INGEST_DATABASE_URL` goes through a transaction-pooling PgBouncer: LISTEN, and `migrate`'s lock (see [PgBouncer](DEPLOYMENT.md#pgbouncer)); start-up refuses one that goes through a pooler or names another database. Empty: LISTEN on `INGEST_DATABASE_URL`; behind a pooler, none: poll",
		set:   func(c *Config, v string) error { c.DatabaseListenURL = v; return checkDatabaseURL(v) }},
	// INGEST_REDIS_CLUSTER comes before INGEST_REDIS_URL: it decides how
	// the URL is read.
	{env: "INGEST_REDIS_CLUSTER", def: "false", typ: "bool", scope: scopeGlobal,
		usage: "Redis Cluster: INGEST_REDIS_URL is a cluster URL (redis://host:port?addr=host2:port2&addr=host3:port3)",
		long:  "Redis Cluster: `INGEST_REDIS_URL` is a cluster URL (`redis://host:port?addr=host2:port2&addr=host3:port3`); the stream and DLQ keys must share a hash tag (start-up refuses otherwise; see [Redis Cluster](DEPLOYMENT.md#redis-cluster))",
		set:   setBool(func(c *Config) *bool { return &c.RedisCluster })},
	{env: "INGEST_REDIS_URL", def: "redis://127.0.0.1:6379/0", typ: "url", scope: scopeGlobal, secret: true,
		usage: "Redis URL (rediss:// for TLS; with INGEST_REDIS_CLUSTER, ?addr=host:port for more cluster nodes)",
		long:  "Redis URL; `rediss://` for TLS; with `INGEST_REDIS_CLUSTER`, more cluster nodes as `?addr=host:port`",
		set: func(c *Config, v string) error {
			c.RedisURL = v
			if c.RedisCluster {
				return checkRedisClusterURL(v)
			}
			return checkRedisURL(v)
		}},
	{env: "INGEST_REDIS_STREAM_KEY", def: stream.DefaultStream, typ: "key", scope: scopeGlobal,
		usage: "task stream key",
		set:   setString(func(c *Config) *string { return &c.StreamKey })},
	{env: "INGEST_REDIS_GROUP", def: stream.DefaultGroup, typ: "name", scope: scopeGlobal,
		usage: "consumer group of the task stream",
		set:   setString(func(c *Config) *string { return &c.Group })},
	{env: "INGEST_REDIS_DLQ_STREAM_KEY", def: dlq.DefaultStream, typ: "key", scope: scopeGlobal, emptyMeansEmpty: true,
		usage: "dead-letter stream key (empty: no DLQ stream, DEAD state only)",
		long:  "dead-letter stream; empty: none (DEAD state only). On Redis Cluster it must share the task stream's hash tag: `{ingest}:tasks`, `{ingest}:tasks:dlq`",
		set:   func(c *Config, v string) error { c.DLQStreamKey = v; return checkName(v) }},
	{env: "INGEST_REDIS_MAX_ATTEMPTS", def: itoa(task.DefaultMaxAttempts), typ: "int", scope: scopeWorker, alsoFor: []string{"task"},
		usage: "runs a task gets before it is DEAD (tasks created without max_attempts)",
		long:  "runs a task gets before DEAD, for tasks created without `max_attempts` (stored as NULL): the setting of the worker that records the failure decides, whichever process created the task; a task's own `max_attempts` wins",
		set:   setInt(func(c *Config) *int { return &c.MaxAttempts }, 1, task.MaxAttemptsLimit)},
	{env: "INGEST_REDIS_RETRY_BASE_BACKOFF_MS", def: ms(backoff.DefaultBase), typ: "ms", scope: scopeWorker,
		usage: "retry delay after the first failure; doubles per failure (0: retry at once)",
		long:  "retry delay after the first failure, doubling per failure, ±10% jitter; `0` (with max `0`): retry at once",
		set:   setMillis(func(c *Config) *time.Duration { return &c.RetryBaseBackoff }, 0)},
	{env: "INGEST_REDIS_RETRY_MAX_BACKOFF_MS", def: ms(backoff.DefaultMax), typ: "ms", scope: scopeWorker,
		usage: "longest retry delay",
		set:   setMillis(func(c *Config) *time.Duration { return &c.RetryMaxBackoff }, 0)},
	{env: "INGEST_REDIS_RECLAIM_ENABLED", def: "true", typ: "bool", scope: scopeWorker,
		usage: "run the reclaimer (XAUTOCLAIM of idle pending entries, due retries, takeover of expired leases)",
		set:   setBool(func(c *Config) *bool { return &c.ReclaimEnabled })},
	{env: "INGEST_REDIS_RECLAIM_INTERVAL_MS", def: ms(reclaim.DefaultInterval), typ: "ms", scope: scopeWorker,
		usage: "time between reclaim rounds",
		long:  "time between reclaim rounds; a due retry that its worker no longer holds (stopped, or the retry more than a minute away) runs within about this much of its time",
		set:   setMillis(func(c *Config) *time.Duration { return &c.ReclaimInterval }, 1)},
	{env: "INGEST_REDIS_RECLAIM_IDLE_MS", def: ms(reclaim.DefaultMinIdle), typ: "ms", scope: scopeWorker,
		usage: "idle time after which a pending entry's worker is taken for dead (running tasks are taken over once their lease expires)",
		long:  "idle time after which a pending entry's worker is taken for dead (the running tasks of a worker silent for a lease are taken over once their lease expires, sooner); `0`: failed entries are re-driven at the next reclaim round. At or below `INGEST_TASK_LEASE_MS`/3 (the heartbeat) the reclaimer also claims running tasks' entries and hands them back (a start-up warning says so; the start guard never runs a task twice) and crashed workers are found by their leases",
		set:   setMillis(func(c *Config) *time.Duration { return &c.ReclaimIdle }, 0)},
	{env: "INGEST_REDIS_RECLAIM_BATCH_SIZE", def: itoa(reclaim.DefaultBatchSize), typ: "int", scope: scopeWorker,
		usage: "entries claimed per XAUTOCLAIM",
		set:   setInt(func(c *Config) *int { return &c.ReclaimBatchSize }, 1, reclaim.MaxBatchSize)},
	{env: "INGEST_OUTBOX_MAX_ATTEMPTS", def: itoa(outbox.DefaultMaxAttempts), typ: "int", scope: scopeWorker,
		usage: "publish attempts of an outbox event before it is DEAD",
		set:   setInt(func(c *Config) *int { return &c.OutboxMaxAttempts }, 1, outbox.MaxAttemptsLimit)},
	{env: "INGEST_OUTBOX_RETRY_BASE_BACKOFF_MS", def: ms(backoff.DefaultBase), typ: "ms", scope: scopeWorker,
		usage: "outbox publish retry delay after the first failure; doubles per failure (0: retry at once)",
		long:  "publish retry delay after the first failure, doubling per failure, ±10% jitter (the tasks' formula); `0`: retry at once",
		set:   setMillis(func(c *Config) *time.Duration { return &c.OutboxRetryBaseBackoff }, 0)},
	{env: "INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS", def: ms(backoff.DefaultMax), typ: "ms", scope: scopeWorker,
		usage: "longest outbox publish retry delay",
		set:   setMillis(func(c *Config) *time.Duration { return &c.OutboxRetryMaxBackoff }, 0)},
	{env: "INGEST_OUTBOX_PUBLISH_BATCH_SIZE", def: itoa(outbox.DefaultBatchSize), typ: "int", scope: scopeWorker,
		usage: "outbox events published per round",
		set:   setInt(func(c *Config) *int { return &c.OutboxPublishBatchSize }, 1, outbox.MaxBatchSize)},
	{env: "INGEST_OUTBOX_PUBLISH_INTERVAL_MS", def: ms(outbox.DefaultPublishInterval), typ: "ms", scope: scopeWorker,
		usage: "outbox poll interval (commits also wake the relay via NOTIFY)",
		set:   setMillis(func(c *Config) *time.Duration { return &c.OutboxPublishInterval }, 1)},
	{env: "INGEST_WORKER_CONCURRENCY", def: itoa(ingest.DefaultConcurrency), typ: "int", scope: scopeWorker,
		usage: "tasks run at the same time by this process",
		set:   setInt(func(c *Config) *int { return &c.WorkerConcurrency }, 1, ingest.MaxConcurrency)},
	{env: "INGEST_CONSUMER_NAME", def: "", typ: "name", scope: scopeWorker,
		usage: "consumer name in the group (default hostname-pid)",
		long:  "consumer name and lease owner; unique per live process. Default: hostname-pid",
		set: func(c *Config, v string) error {
			if v == "" {
				c.ConsumerName, c.consumerNameFromDefault = defaultConsumerName(), true
				return nil
			}
			if strings.ContainsAny(v, " \t\r\n") {
				return fmt.Errorf("%q contains white space", v)
			}
			c.ConsumerName = v
			return checkName(v)
		}},
	{env: "INGEST_TASK_LEASE_MS", def: ms(ingest.DefaultTaskLease), typ: "ms", scope: scopeWorker,
		usage: "lease of a running task; renewed by the heartbeat",
		long:  "lease of a running task, renewed by the heartbeat every third of it; once it has expired and the worker has been silent for as long, another worker takes the task over (see [failure semantics](FAILURES.md))",
		set:   setMillis(func(c *Config) *time.Duration { return &c.TaskLease }, 100)},
	{env: "INGEST_TASK_TIMEOUT_MS", def: ms(ingest.DefaultTaskTimeout), typ: "ms", scope: scopeWorker,
		usage: "default deadline of a handler run (a failed attempt) for tasks without timeout_ms; 0: none",
		long:  "default deadline of a handler run for tasks without `timeout_ms` and kinds without their own (a failed attempt whose `last_error` says timeout); `0`: none",
		set:   setMillis(func(c *Config) *time.Duration { return &c.TaskTimeout }, 0)},
	{env: "INGEST_SHUTDOWN_TIMEOUT_MS", def: ms(ingest.DefaultShutdownTimeout), typ: "ms", scope: scopeWorker,
		usage: "grace period for running tasks on SIGTERM/SIGINT; later ones are handed back",
		long:  "grace period of running tasks at SIGTERM/SIGINT; the tasks still running then are handed back (RETRYING, due at once, no failure counted)",
		set:   setMillis(func(c *Config) *time.Duration { return &c.ShutdownTimeout }, 1)},
	{env: "INGEST_MAX_PAYLOAD_BYTES", def: itoa(task.DefaultMaxPayloadBytes), typ: "bytes", scope: scopeWorker, alsoFor: []string{"enqueue", "bench"},
		usage: "largest task payload accepted",
		long:  "largest task payload (larger: 413 from the API)",
		set:   setInt(func(c *Config) *int { return &c.MaxPayloadBytes }, task.PayloadBytesRange.Min, task.PayloadBytesRange.Max)},
	{env: "INGEST_RESULT_MAX_BYTES", def: itoa(task.DefaultMaxResultBytes), typ: "bytes", scope: scopeWorker,
		usage: "largest handler result stored with a task (JSON); a larger one fails the run",
		long:  "largest result a handler may return, stored with the task as JSON (shown by `GET /v1/tasks/{id}`, `task show` and the dashboard; see [pipelines](PIPELINES.md)); a larger or invalid one fails the run like an error",
		set:   setInt(func(c *Config) *int { return &c.MaxResultBytes }, task.ResultBytesRange.Min, task.ResultBytesRange.Max)},
	{env: "INGEST_HTTP_ADDR", def: "127.0.0.1:8080", typ: "host:port", scope: scopeWorker, emptyMeansEmpty: true, alsoFor: []string{"healthcheck"},
		usage: "HTTP listen address: /metrics, /healthz, /readyz, task API (empty: no HTTP server)",
		long:  "`/metrics`, `/healthz`, `/readyz`, the task API and the [dashboard](DASHBOARD.md) (`/ui/`); empty (set but empty): no HTTP server",
		set: func(c *Config, v string) error {
			c.HTTPAddr = v
			if v == "" {
				return nil
			}
			_, port, err := net.SplitHostPort(v)
			if err != nil {
				return fmt.Errorf("%q is not host:port", v)
			}
			if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
				return fmt.Errorf("%q: port must be a number from 0 to 65535", v)
			}
			return nil
		}},
	{env: "INGEST_HTTP_ALLOWED_HOSTS", typ: "host,...", scope: scopeWorker,
		usage: "Host names and addresses the HTTP server answers besides the loopback names and INGEST_HTTP_ADDR's host (with 0.0.0.0, [::] or no host: the machine's name and addresses), comma-separated; host:port for one port only; * for any",
		long:  "the `Host` names and addresses the HTTP server answers besides the loopback names and `INGEST_HTTP_ADDR`'s host (with `0.0.0.0`, `[::]` or no host: the machine's host name and interface addresses), comma-separated (`host:port` for one port only; `*`: any host); any other Host gets 421 (see [security](SECURITY.md))",
		set: func(c *Config, v string) error {
			c.HTTPAllowedHosts = v
			_, err := httpguard.ParseHosts(strings.Split(v, ","))
			return err
		}},
	{env: "INGEST_API_TOKEN", typ: "token", scope: scopeWorker, secret: true, emptyMeansEmpty: true,
		usage: "when set, the task API requires Authorization: Bearer <token>",
		long:  "when set, the task API requires `Authorization: Bearer <token>` and the dashboard a login with it; probes and metrics stay open. Empty: no auth. Prefer the variable: flags are visible in `ps`",
		set:   func(c *Config, v string) error { c.APIToken = v; return nil }},
	{env: "INGEST_UI_READONLY", def: "false", typ: "bool", scope: scopeWorker,
		usage: "the web dashboard (/ui/) shows no action buttons and refuses actions with 403",
		long:  "the web dashboard (`/ui/`, see [the dashboard](DASHBOARD.md)) shows no action buttons and refuses every action with 403",
		set:   setBool(func(c *Config) *bool { return &c.UIReadOnly })},
	{env: "INGEST_WEBHOOK_URL", typ: "url", scope: scopeWorker, secret: true, emptyMeansEmpty: true,
		usage: "built-in handler: POST every task to this URL",
		long:  "the built-in handler's target: every run is POSTed there (see [the webhook handler](GETTING-STARTED.md#the-built-in-webhook-handler))",
		set: func(c *Config, v string) error {
			c.WebhookURL = v
			if v == "" {
				return nil
			}
			return checkHTTPURL(v)
		}},
	{env: "INGEST_WEBHOOK_TIMEOUT_MS", def: ms(webhook.DefaultTimeout), typ: "ms", scope: scopeWorker,
		usage: "timeout of one webhook request",
		set:   setMillis(func(c *Config) *time.Duration { return &c.WebhookTimeout }, 1)},
	{env: "INGEST_WEBHOOK_BATCH_MAX", def: "1", typ: "int", scope: scopeWorker,
		usage: "the webhook handler POSTs up to this many tasks of a kind at once (1: one POST per task)",
		long:  "the webhook handler POSTs up to this many tasks of a kind in one request, 1.." + strconv.Itoa(ingest.MaxBatchSize) + "; 1: one POST per task (see [batch handlers](PIPELINES.md#batch-handlers))",
		set:   setInt(func(c *Config) *int { return &c.WebhookBatchMax }, 1, ingest.MaxBatchSize)},
	{env: "INGEST_WEBHOOK_BATCH_WAIT_MS", def: ms(defaultWebhookBatchWait), typ: "ms", scope: scopeWorker,
		usage: "with INGEST_WEBHOOK_BATCH_MAX > 1: how long a batch waits to fill after its first task",
		long:  "with `INGEST_WEBHOOK_BATCH_MAX` > 1: how long a batch waits to fill after its first task, 0.." + ms(ingest.MaxBatchWait) + " (0: no waiting, a batch is handed over at once with whatever has joined it)",
		set: func(c *Config, v string) error {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if most := ingest.MaxBatchWait.Milliseconds(); err != nil || n < 0 || n > most {
				return fmt.Errorf("must be a whole number of milliseconds from 0 to %d, got %q", most, v)
			}
			c.WebhookBatchWait = time.Duration(n) * time.Millisecond
			return nil
		}},
	{env: "INGEST_QUEUE", def: queueRedis, typ: "queue", scope: scopeGlobal,
		usage: "the transport that carries tasks to workers: redis or kafka",
		long:  "the transport that carries tasks to workers: `redis` or `kafka` (see [Kafka mode](KAFKA.md))",
		set: func(c *Config, v string) error {
			switch v = strings.ToLower(strings.TrimSpace(v)); v {
			case queueRedis, queueKafka:
				c.Queue = v
				return nil
			}
			return fmt.Errorf("%q is not one of redis, kafka", v)
		}},
	{env: "KAFKA_BOOTSTRAP_SERVERS", def: "127.0.0.1:9092", typ: "host:port,...", scope: scopeGlobal,
		usage: "Kafka brokers, comma-separated (INGEST_QUEUE=kafka)",
		set: func(c *Config, v string) error {
			c.KafkaBrokers = v
			for _, b := range strings.Split(v, ",") {
				if _, _, err := net.SplitHostPort(strings.TrimSpace(b)); err != nil {
					return fmt.Errorf("%q is not host:port", b)
				}
			}
			return nil
		}},
	{env: "INGEST_KAFKA_TOPIC", def: kafka.DefaultTopic, typ: "topic", scope: scopeGlobal,
		usage: "task topic (INGEST_QUEUE=kafka)",
		set:   setString(func(c *Config) *string { return &c.KafkaTopic })},
	{env: "INGEST_KAFKA_GROUP", def: kafka.DefaultGroup, typ: "name", scope: scopeGlobal,
		usage: "consumer group of the task topic (INGEST_QUEUE=kafka)",
		set:   setString(func(c *Config) *string { return &c.KafkaGroup })},
	{env: "INGEST_KAFKA_DLQ_TOPIC", def: kafka.DefaultDLQTopic, typ: "topic", scope: scopeGlobal, emptyMeansEmpty: true,
		usage: "dead-letter topic (empty: no DLQ topic, DEAD state only; INGEST_QUEUE=kafka)",
		set:   func(c *Config, v string) error { c.KafkaDLQTopic = v; return checkName(v) }},
	{env: "INGEST_KAFKA_MAX_ATTEMPTS", def: itoa(task.DefaultMaxAttempts), typ: "int", scope: scopeWorker, alsoFor: []string{"task"},
		usage: "runs a task gets before it is DEAD (INGEST_QUEUE=kafka; tasks created without max_attempts)",
		set:   setInt(func(c *Config) *int { return &c.KafkaMaxAttempts }, 1, task.MaxAttemptsLimit)},
	{env: "INGEST_KAFKA_RETRY_BASE_BACKOFF_MS", def: ms(backoff.DefaultBase), typ: "ms", scope: scopeWorker,
		usage: "retry delay after the first failure, of tasks and of outbox publishes; doubles per failure (INGEST_QUEUE=kafka)",
		set:   setMillis(func(c *Config) *time.Duration { return &c.KafkaRetryBaseBackoff }, 0)},
	{env: "INGEST_KAFKA_RETRY_MAX_BACKOFF_MS", def: ms(backoff.DefaultMax), typ: "ms", scope: scopeWorker,
		usage: "longest retry delay (INGEST_QUEUE=kafka)",
		set:   setMillis(func(c *Config) *time.Duration { return &c.KafkaRetryMaxBackoff }, 0)},
	{env: "INGEST_KAFKA_PUBLISH_BATCH_SIZE", def: itoa(outbox.DefaultBatchSize), typ: "int", scope: scopeWorker,
		usage: "outbox events published per produce call (INGEST_QUEUE=kafka)",
		set:   setInt(func(c *Config) *int { return &c.KafkaPublishBatchSize }, 1, outbox.MaxBatchSize)},
	{env: "INGEST_KAFKA_PUBLISH_INTERVAL_MS", def: ms(outbox.DefaultPublishInterval), typ: "ms", scope: scopeWorker,
		usage: "outbox poll interval (INGEST_QUEUE=kafka; commits also wake the relay via NOTIFY)",
		set:   setMillis(func(c *Config) *time.Duration { return &c.KafkaPublishInterval }, 1)},
	{env: "INGEST_PERIODIC", typ: "json", scope: scopeWorker, emptyMeansEmpty: true,
		usage: `periodic tasks, e.g. [{"kind":"sync","every":"30s"},{"kind":"report","cron":"0 3 * * *","payload":{"x":1}}]`,
		long:  "periodic tasks, a JSON array, e.g. `[{\"kind\":\"sync\",\"every\":\"30s\"},{\"kind\":\"report\",\"cron\":\"0 3 * * *\",\"payload\":{\"x\":1}}]` (see [scheduling](SCHEDULING.md)); empty: none",
		set: func(c *Config, v string) error {
			if _, err := maintenance.ParseSchedules("", []byte(v)); err != nil {
				return err
			}
			c.Periodic = v
			return nil
		}},
	{env: "INGEST_RETENTION_SUCCEEDED", def: goDuration(maintenance.DefaultRetentionSucceeded), typ: "duration", scope: scopeWorker,
		usage: "SUCCEEDED tasks are deleted (with their outbox rows; audit rows go with their day's partition) this long after they finished (Go duration: 24h, 720h; 0: kept forever)",
		long:  "SUCCEEDED tasks are deleted this long after `finished_at`, with their outbox rows; their audit rows go with their day's partition (Go duration: `24h`, `720h`; `0`: kept forever; see [retention](OPERATIONS.md#retention))",
		set:   setRetention(func(c *Config) *time.Duration { return &c.RetentionSucceeded })},
	{env: "INGEST_RETENTION_CANCELLED", def: goDuration(maintenance.DefaultRetentionCancelled), typ: "duration", scope: scopeWorker,
		usage: "CANCELLED tasks are deleted (with their outbox rows; audit rows go with their day's partition) this long after they were cancelled (Go duration; 0: kept forever)",
		set:   setRetention(func(c *Config) *time.Duration { return &c.RetentionCancelled })},
	{env: "INGEST_RETENTION_DEAD", def: goDuration(maintenance.DefaultRetentionDead), typ: "duration", scope: scopeWorker,
		usage: "DEAD tasks are deleted (with their outbox rows and DLQ entry; audit rows go with their day's partition) this long after they died (Go duration; 0: kept forever)",
		set:   setRetention(func(c *Config) *time.Duration { return &c.RetentionDead })},
	{env: "INGEST_ENCRYPTION_KEYS", typ: "id:key,...", scope: scopeGlobal, secret: true, emptyMeansEmpty: true,
		usage: "encryption keys of payloads and results at rest, id:base64-of-32-bytes,... (the first encrypts, all decrypt; empty: none)",
		long:  "the keys that encrypt task payloads and results at rest (AES-256-GCM), `id:base64-of-32-bytes,...`: the first encrypts, all decrypt; ids are letters, digits, `_`, `-` and `.`; generate a key with `openssl rand -base64 32`. Empty: payloads and results are stored in clear. Every process that reads or runs tasks needs the keys (see [encryption](ENCRYPTION.md)). Prefer the variable: flags are visible in `ps`",
		set: func(c *Config, v string) error {
			k, err := seal.Parse(v)
			if err != nil {
				// Names entries by position and id, never a key.
				return fmt.Errorf("INGEST_ENCRYPTION_KEYS: %w", err)
			}
			c.Keyring = k
			return nil
		}},
	{env: "INGEST_LOG_LEVEL", def: "info", typ: "level", scope: scopeGlobal,
		usage: "debug, info, warn or error",
		long:  "`debug`, `info`, `warn` or `error`",
		set: func(c *Config, v string) error {
			switch strings.ToLower(v) {
			case "debug":
				c.LogLevel = slog.LevelDebug
			case "info":
				c.LogLevel = slog.LevelInfo
			case "warn", "warning":
				c.LogLevel = slog.LevelWarn
			case "error":
				c.LogLevel = slog.LevelError
			default:
				return fmt.Errorf("%q is not one of debug, info, warn, error", v)
			}
			return nil
		}},
	{env: "INGEST_LOG_FORMAT", def: "text", typ: "format", scope: scopeGlobal,
		usage: "text or json",
		long:  "`text` or `json` (logs go to stderr; the Redis client's own lines too, at WARN with `component=go-redis`)",
		set: func(c *Config, v string) error {
			switch strings.ToLower(v) {
			case "text", "json":
				c.LogFormat = strings.ToLower(v)
				return nil
			}
			return fmt.Errorf("%q is not one of text, json", v)
		}},
}

// settingGroups divide settings into the sections of the configuration
// reference: each group starts at the setting named first and runs to the
// next group's first.
var settingGroups = []struct{ first, title string }{
	{"INGEST_DATABASE_URL", "Connections"},
	{"INGEST_REDIS_STREAM_KEY", "Redis stream, retries and the reclaimer"},
	{"INGEST_OUTBOX_MAX_ATTEMPTS", "Outbox relay"},
	{"INGEST_WORKER_CONCURRENCY", "Worker"},
	{"INGEST_HTTP_ADDR", "HTTP server, task API and dashboard"},
	{"INGEST_WEBHOOK_URL", "Webhook handler"},
	{"INGEST_QUEUE", "Queue mode and Kafka"},
	{"INGEST_PERIODIC", "Periodic tasks and retention"},
	{"INGEST_ENCRYPTION_KEYS", "Encryption at rest"},
	{"INGEST_LOG_LEVEL", "Logging"},
}

// periodic returns the schedules of INGEST_PERIODIC (validated when it
// was read).
func (c *Config) periodic() []maintenance.Schedule {
	s, _ := maintenance.ParseSchedules("", []byte(c.Periodic))
	return s
}

// itoa and ms write a package's default as a setting's text.
func itoa(n int) string { return strconv.Itoa(n) }

// defaultWebhookBatchWait is INGEST_WEBHOOK_BATCH_WAIT_MS's default.
const defaultWebhookBatchWait = 100 * time.Millisecond

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// setString reads a name (a key, a group, a topic): not empty, and shown
// safely wherever it is printed (checkName).
func setString(field func(*Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error {
		if strings.TrimSpace(v) == "" {
			return errors.New("must not be empty")
		}
		*field(c) = v
		return checkName(v)
	}
}

// checkName applies the rule of names users choose (task.CheckName: no
// control or bidirectional character, valid UTF-8) to a setting that
// names something: it is printed by the CLI, logged and shown on the
// dashboard.
func checkName(v string) error {
	if ferr := task.CheckName("the value", v, maxNameBytes); ferr != nil {
		return errors.New(ferr.Msg)
	}
	return nil
}

// maxNameBytes bounds a setting that names something.
const maxNameBytes = 1000

// setInt reads a whole number from least to most, bounds the package that
// uses the setting owns (a worker's MaxConcurrency, task.MaxAttemptsLimit).
func setInt(field func(*Config) *int, least, most int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a whole number from %d to %d", v, least, most)
		}
		if n < least || n > most {
			return fmt.Errorf("must be from %d to %d, got %d", least, most, n)
		}
		*field(c) = int(n)
		return nil
	}
}

// maxSettingDuration bounds every setting of milliseconds.
const maxSettingDuration = 365 * 24 * time.Hour

func setMillis(field func(*Config) *time.Duration, least int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a whole number of milliseconds", v)
		}
		if most := int64(maxSettingDuration / time.Millisecond); n < least || n > most {
			return fmt.Errorf("must be from %d to %d ms (at most a year), got %d", least, most, n)
		}
		*field(c) = time.Duration(n) * time.Millisecond
		return nil
	}
}

// goDuration writes d as a Go duration without zero units: 24h, 90m.
func goDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// setRetention reads a retention window: a Go duration of whole
// milliseconds in task.RetentionRange, 0 keeping forever.
func setRetention(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%q is not a Go duration (24h, 90m; 0: kept forever)", v)
		}
		r := task.RetentionRange
		if d < 0 || d > task.MaxRetention || d%time.Millisecond != 0 {
			return fmt.Errorf("must be 0 (kept forever) or a duration of whole milliseconds up to %s, got %s", goDuration(time.Duration(r.Max)*time.Millisecond), v)
		}
		if _, ferr := r.Millis(d.Milliseconds()); ferr != nil {
			return ferr
		}
		*field(c) = d
		return nil
	}
}

// retention is the task retention of the maintainer: a window of 0 keeps
// the tasks of its state forever.
func (c *Config) retention() maintenance.RetentionConfig {
	w := func(d time.Duration) time.Duration {
		if d == 0 {
			return task.KeepForever
		}
		return d
	}
	return maintenance.RetentionConfig{Tasks: task.Windows{
		Succeeded: w(c.RetentionSucceeded), Cancelled: w(c.RetentionCancelled), Dead: w(c.RetentionDead)}}
}

func setBool(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		*field(c) = b
		return nil
	}
}

func checkDatabaseURL(v string) error {
	if v == "" {
		return nil
	}
	if strings.Contains(v, "://") {
		u, err := url.Parse(v)
		if err != nil {
			return fmt.Errorf("%s is not a valid URL", redact.DSN(v))
		}
		if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			return fmt.Errorf("%s: the scheme must be postgres:// or postgresql://", redact.DSN(v))
		}
	}
	if _, err := pgxpool.ParseConfig(v); err != nil {
		return fmt.Errorf("%s is not a valid connection string", redact.DSN(v))
	}
	return nil
}

func checkRedisURL(v string) error {
	u, err := url.Parse(v)
	if err != nil || !strings.Contains(v, "://") {
		return fmt.Errorf("%s is not a valid URL (want redis://host:port/db)", redact.DSN(v))
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		return fmt.Errorf("%s: the scheme must be redis://, rediss:// or unix://", redact.DSN(v))
	}
	if _, err := redis.ParseURL(v); err != nil {
		msg := strings.TrimPrefix(err.Error(), "redis: ")
		return fmt.Errorf("%s: %s", redact.DSN(v), redact.NewScrubber(redact.Secrets(v)...).String(msg))
	}
	return nil
}

// checkRedisClusterURL checks a Redis Cluster URL: redis:// or rediss://,
// more nodes in addr parameters, database 0 only.
func checkRedisClusterURL(v string) error {
	u, err := url.Parse(v)
	if err != nil || !strings.Contains(v, "://") {
		return fmt.Errorf("%s is not a valid URL (want redis://host:port?addr=host2:port2 with INGEST_REDIS_CLUSTER=true)", redact.DSN(v))
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return fmt.Errorf("%s: the scheme of a cluster URL must be redis:// or rediss://", redact.DSN(v))
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		return fmt.Errorf("%s: Redis Cluster has only database 0, not %q", redact.DSN(v), db)
	}
	if _, err := redis.ParseClusterURL(v); err != nil {
		msg := strings.TrimPrefix(err.Error(), "redis: ")
		return fmt.Errorf("%s: %s", redact.DSN(v), redact.NewScrubber(redact.Secrets(v)...).String(msg))
	}
	return nil
}

func checkHTTPURL(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("%s is not a valid URL", redact.DSN(v))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%s: the scheme must be http:// or https://", redact.DSN(v))
	}
	if u.Host == "" {
		return fmt.Errorf("%s has no host", redact.DSN(v))
	}
	return nil
}

func defaultConsumerName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "ingest-worker"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// configError is a bad setting: exit code 2.
type configError struct {
	env, flag string
	err       error
}

func (e *configError) Error() string {
	return fmt.Sprintf("%s (--%s): %v", e.env, e.flag, e.err)
}

// addFlags registers the flags of settings of scope sc on fs.
func addFlags(fs *pflag.FlagSet, sc scope) {
	for _, s := range settings {
		if s.scope == sc {
			addFlag(fs, s)
		}
	}
}

// addFlag registers the flag of one setting on fs.
func addFlag(fs *pflag.FlagSet, s setting) {
	usage := s.usage + " [" + s.env
	if s.def != "" {
		usage += ", default " + s.def
	}
	usage += "]"
	f := fs.VarPF(&settingValue{typ: s.typ}, s.flagName(), "", usage)
	if s.typ == "bool" {
		f.NoOptDefVal = "true"
	}
}

// settingFlag returns the setting of variable env.
func settingFlag(env string) setting {
	for _, s := range settings {
		if s.env == env {
			return s
		}
	}
	panic("no setting " + env)
}

// settingValue is a flag holding a setting's raw text; parsing happens in
// loadConfig, so flags and variables get the same checks and messages.
type settingValue struct {
	typ string
	v   string
}

func (v *settingValue) String() string     { return v.v }
func (v *settingValue) Set(s string) error { v.v = s; return nil }
func (v *settingValue) Type() string       { return v.typ }

// source says where a setting's value came from.
type source int

const (
	fromDefault source = iota
	fromEnv
	fromFlag
)

// resolved is one setting's effective raw value.
type resolved struct {
	setting
	value string
	from  source
	// ignored is why value is invalid when the command does not use the
	// setting and goes on with its default.
	ignored error
}

// loadConfig resolves every setting for cmd (flag, then environment, then
// overrides, then the default), parses and validates them. overrides
// replace defaults (demo uses quicker timings); lookup reads the
// environment.
func loadConfig(cmd *cobra.Command, lookup func(string) (string, bool), overrides map[string]string) (*Config, []resolved, error) {
	c := &Config{}
	var all []resolved
	var errs []error
	path := ""
	if cmd != nil && cmd.HasParent() {
		path = strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	}
	for _, s := range settings {
		r := resolved{setting: s, value: s.def, from: fromDefault}
		if d, ok := overrides[s.env]; ok {
			r.value = d
		}
		if v, ok := lookup(s.env); ok && (v != "" || s.emptyMeansEmpty) {
			r.value, r.from = v, fromEnv
		}
		if cmd != nil {
			if f := cmd.Flags().Lookup(s.flagName()); f != nil && f.Changed {
				r.value, r.from = f.Value.String(), fromFlag
			}
		}
		if err := s.set(c, r.value); err != nil {
			if s.usedBy(path) {
				errs = append(errs, &configError{env: s.env, flag: s.flagName(), err: err})
			} else if derr := s.set(c, s.def); derr == nil {
				r.ignored = err
			} else {
				errs = append(errs, &configError{env: s.env, flag: s.flagName(), err: err})
			}
		}
		all = append(all, r)
	}
	if len(errs) == 0 {
		for _, err := range c.validate() {
			if ce := (*configError)(nil); errors.As(err, &ce) && !settingOf(ce.env).usedBy(path) {
				continue
			}
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, all, errors.Join(errs...)
	}
	return c, all, nil
}

// settingOf returns the setting of variable env (a global one when there
// is none).
func settingOf(env string) setting {
	for _, s := range settings {
		if s.env == env {
			return s
		}
	}
	return setting{env: env}
}

// taskBackoff is the retry policy of failed task runs
// (INGEST_REDIS_RETRY_BASE_BACKOFF_MS, INGEST_REDIS_RETRY_MAX_BACKOFF_MS).
func (c *Config) taskBackoff() backoff.Policy {
	return backoff.Policy{Base: c.RetryBaseBackoff, Max: c.RetryMaxBackoff, Jitter: backoff.DefaultJitter}
}

// outboxBackoff is the retry policy of failed outbox publishes
// (INGEST_OUTBOX_RETRY_BASE_BACKOFF_MS, INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS).
func (c *Config) outboxBackoff() backoff.Policy {
	return backoff.Policy{Base: c.OutboxRetryBaseBackoff, Max: c.OutboxRetryMaxBackoff, Jitter: backoff.DefaultJitter}
}

// validate checks relations between settings.
func (c *Config) validate() []error {
	var errs []error
	bad := func(env, format string, args ...any) {
		errs = append(errs, &configError{env: env, flag: setting{env: env}.flagName(), err: fmt.Errorf(format, args...)})
	}
	if c.RetryMaxBackoff < c.RetryBaseBackoff {
		bad("INGEST_REDIS_RETRY_MAX_BACKOFF_MS", "(%d) must be >= INGEST_REDIS_RETRY_BASE_BACKOFF_MS (%d)", c.RetryMaxBackoff.Milliseconds(), c.RetryBaseBackoff.Milliseconds())
	}
	if c.OutboxRetryMaxBackoff < c.OutboxRetryBaseBackoff {
		bad("INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS", "(%d) must be >= INGEST_OUTBOX_RETRY_BASE_BACKOFF_MS (%d)", c.OutboxRetryMaxBackoff.Milliseconds(), c.OutboxRetryBaseBackoff.Milliseconds())
	}
	if c.KafkaRetryMaxBackoff < c.KafkaRetryBaseBackoff {
		bad("INGEST_KAFKA_RETRY_MAX_BACKOFF_MS", "(%d) must be >= INGEST_KAFKA_RETRY_BASE_BACKOFF_MS (%d)", c.KafkaRetryMaxBackoff.Milliseconds(), c.KafkaRetryBaseBackoff.Milliseconds())
	}
	if c.KafkaDLQTopic != "" && c.KafkaDLQTopic == c.KafkaTopic {
		bad("INGEST_KAFKA_DLQ_TOPIC", "must differ from INGEST_KAFKA_TOPIC (%s)", c.KafkaTopic)
	}
	if c.DLQStreamKey != "" && c.DLQStreamKey == c.StreamKey {
		bad("INGEST_REDIS_DLQ_STREAM_KEY", "must differ from INGEST_REDIS_STREAM_KEY (%s)", c.StreamKey)
	}
	if tag := dlq.HashTag(c.StreamKey); c.DLQStreamKey != "" && tag != dlq.HashTag(c.DLQStreamKey) {
		bad("INGEST_REDIS_DLQ_STREAM_KEY", "%q must have the same {hash tag} as INGEST_REDIS_STREAM_KEY %q (one Lua script writes both keys; Redis Cluster needs them in one slot)", c.DLQStreamKey, c.StreamKey)
	} else if c.RedisCluster && c.Queue == queueRedis && c.DLQStreamKey != "" && tag == "" {
		bad("INGEST_REDIS_DLQ_STREAM_KEY", "%q and INGEST_REDIS_STREAM_KEY %q must share a {hash tag} with INGEST_REDIS_CLUSTER=true, so that they are in one slot (one Lua script writes both keys), for example {ingest}:tasks and {ingest}:tasks:dlq", c.DLQStreamKey, c.StreamKey)
	}
	return errs
}

// allowedHosts is the Host allow-list of the HTTP server on HTTPAddr
// (INGEST_HTTP_ALLOWED_HOSTS; httpguard.ForListen).
func (c *Config) allowedHosts() (*httpguard.Hosts, error) {
	return httpguard.ForListen(c.HTTPAddr, strings.Split(c.HTTPAllowedHosts, ","))
}

// reclaimIdle is the worker's reclaim idle time. 0 means "re-drive failed
// entries at the next reclaim round": Redis keeps idle times in whole
// milliseconds, so it is 1 ms.
func (c *Config) reclaimIdle() time.Duration { return max(c.ReclaimIdle, time.Millisecond) }

// warnings are settings that work but cost something the operator should
// know of.
func (c *Config) warnings() []string {
	var out []string
	if c.ReclaimEnabled && c.reclaimIdle() <= c.TaskLease/3 {
		out = append(out, fmt.Sprintf("INGEST_REDIS_RECLAIM_IDLE_MS (%d) is not above the heartbeat interval, INGEST_TASK_LEASE_MS/3 (%d): "+
			"the reclaimer also claims the entries of running tasks and hands them back each round (the start guard never runs a task twice); "+
			"a crashed worker's tasks are recovered when their lease (INGEST_TASK_LEASE_MS) expires",
			c.ReclaimIdle.Milliseconds(), (c.TaskLease/3).Milliseconds()))
	}
	return out
}

// secretsOf returns the secret values among resolved settings (whether or
// not they parsed), for scrubbing output.
func secretsOf(all []resolved) []string {
	var out []string
	for _, r := range all {
		switch {
		case !r.secret || r.value == "":
		case r.env == "INGEST_API_TOKEN":
			out = append(out, r.value)
		case r.env == "INGEST_ENCRYPTION_KEYS":
			out = append(out, keyListSecrets(r.value)...)
		default:
			out = append(out, redact.Secrets(r.value)...)
		}
	}
	return out
}

// newScrubberFor returns a scrubber of the secrets among resolved settings.
func newScrubberFor(all []resolved) *redact.Scrubber {
	return redact.NewScrubber(secretsOf(all)...)
}

// display returns a setting's value as it may be shown.
func (r resolved) display() string {
	switch {
	case r.value == "":
		return ""
	case r.env == "INGEST_API_TOKEN":
		return redact.Mask
	case r.env == "INGEST_ENCRYPTION_KEYS":
		return maskKeyList(r.value)
	case r.secret:
		return redact.DSN(r.value)
	}
	return r.value
}

// keyListSecrets returns the keys of an INGEST_ENCRYPTION_KEYS value
// (what follows each entry's ':', as given and without its padding),
// whether or not it parsed, for scrubbing output.
func keyListSecrets(v string) []string {
	var out []string
	for _, entry := range strings.Split(v, ",") {
		if _, key, ok := strings.Cut(entry, ":"); ok {
			for _, k := range []string{strings.TrimSpace(key), strings.TrimRight(strings.TrimSpace(key), "=")} {
				if len(k) >= 4 { // shorter is no key, and would scrub ordinary text
					out = append(out, k)
				}
			}
		} else if e := strings.TrimSpace(entry); len(e) >= 4 {
			out = append(out, e) // no id: all of it may be a key
		}
	}
	return out
}

// maskKeyList shows an INGEST_ENCRYPTION_KEYS value as its key ids, each
// key masked: "k2:xxxxx,k1:xxxxx".
func maskKeyList(v string) string {
	var out []string
	for _, entry := range strings.Split(v, ",") {
		id, _, ok := strings.Cut(strings.TrimSpace(entry), ":")
		if !ok || seal.CheckID(id) != nil {
			id = "?"
		}
		out = append(out, id+":"+redact.Mask)
	}
	return strings.Join(out, ",")
}
