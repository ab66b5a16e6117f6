package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// envOf returns a lookup function over env.
func envOf(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// parse resolves the configuration as `run` would, with env and flags.
func parse(t *testing.T, env map[string]string, flags ...string) (*Config, []resolved, error) {
	t.Helper()
	cmd := &cobra.Command{Use: "run"}
	addFlags(cmd.Flags(), scopeGlobal)
	addFlags(cmd.Flags(), scopeWorker)
	if err := cmd.Flags().Parse(flags); err != nil {
		t.Fatalf("parse flags %v: %v", flags, err)
	}
	return loadConfig(cmd, envOf(env), nil)
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c, _, err := parse(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		RedisURL: "redis://127.0.0.1:6379/0", StreamKey: "ingest:tasks", Group: "ingest-workers", DLQStreamKey: "ingest:tasks:dlq",
		MaxAttempts: 10, RetryBaseBackoff: time.Second, RetryMaxBackoff: 600 * time.Second, MaxPayloadBytes: 1 << 20, MaxResultBytes: 1 << 20,
		ReclaimEnabled: true, ReclaimInterval: 5 * time.Second, ReclaimIdle: 600 * time.Second, ReclaimBatchSize: 20,
		OutboxMaxAttempts: 10, OutboxRetryBaseBackoff: time.Second, OutboxRetryMaxBackoff: 600 * time.Second,
		OutboxPublishBatchSize: 20, OutboxPublishInterval: time.Second, WorkerConcurrency: 16,
		ConsumerName: c.ConsumerName, consumerNameFromDefault: true,
		TaskLease: 30 * time.Second, TaskTimeout: 0, ShutdownTimeout: 30 * time.Second,
		HTTPAddr: "127.0.0.1:8080", WebhookTimeout: 30 * time.Second, WebhookBatchMax: 1, WebhookBatchWait: 100 * time.Millisecond, LogLevel: slog.LevelInfo, LogFormat: "text",
		Queue: "redis", KafkaBrokers: "127.0.0.1:9092", KafkaTopic: "ingest.tasks", KafkaGroup: "ingest-workers",
		KafkaDLQTopic: "ingest.tasks.dlq", KafkaMaxAttempts: 10, KafkaRetryBaseBackoff: time.Second,
		KafkaRetryMaxBackoff: 600 * time.Second, KafkaPublishBatchSize: 20, KafkaPublishInterval: time.Second,
		RetentionSucceeded: 24 * time.Hour, RetentionCancelled: 24 * time.Hour, RetentionDead: 168 * time.Hour,
	}
	if *c != want {
		t.Fatalf("defaults:\n got %+v\nwant %+v", *c, want)
	}
	if !strings.Contains(c.ConsumerName, "-") {
		t.Fatalf("default consumer name %q is not hostname-pid", c.ConsumerName)
	}
}

func TestConfigSources(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		env   map[string]string
		flags []string
		check func(c *Config) bool
	}{
		{"EnvSets", map[string]string{"INGEST_WORKER_CONCURRENCY": "4"}, nil, func(c *Config) bool { return c.WorkerConcurrency == 4 }},
		{"FlagOverridesEnv", map[string]string{"INGEST_WORKER_CONCURRENCY": "4"}, []string{"--worker-concurrency=7"}, func(c *Config) bool { return c.WorkerConcurrency == 7 }},
		{"FlagWithoutEnv", nil, []string{"--redis-url", "rediss://cache:6380/2"}, func(c *Config) bool { return c.RedisURL == "rediss://cache:6380/2" }},
		{"Millis", map[string]string{"INGEST_REDIS_RECLAIM_IDLE_MS": "60000", "INGEST_REDIS_RECLAIM_INTERVAL_MS": "250"}, nil,
			func(c *Config) bool { return c.ReclaimIdle == time.Minute && c.ReclaimInterval == 250*time.Millisecond }},
		{"BoolFlagAlone", map[string]string{"INGEST_REDIS_RECLAIM_ENABLED": "false"}, []string{"--redis-reclaim-enabled"}, func(c *Config) bool { return c.ReclaimEnabled }},
		{"BoolEnv", map[string]string{"INGEST_REDIS_RECLAIM_ENABLED": "0"}, nil, func(c *Config) bool { return !c.ReclaimEnabled }},
		{"EmptyDLQMeansNone", map[string]string{"INGEST_REDIS_DLQ_STREAM_KEY": ""}, nil, func(c *Config) bool { return c.DLQStreamKey == "" }},
		{"EmptyNumberMeansDefault", map[string]string{"INGEST_WORKER_CONCURRENCY": ""}, nil, func(c *Config) bool { return c.WorkerConcurrency == 16 }},
		{"EmptyHTTPAddrDisables", map[string]string{"INGEST_HTTP_ADDR": ""}, nil, func(c *Config) bool { return c.HTTPAddr == "" }},
		{"RetentionWindows", map[string]string{"INGEST_RETENTION_SUCCEEDED": "720h", "INGEST_RETENTION_CANCELLED": "0", "INGEST_RETENTION_DEAD": "90m"}, nil,
			func(c *Config) bool {
				w := c.retention().Tasks
				return c.RetentionSucceeded == 720*time.Hour && w.Succeeded == 720*time.Hour &&
					c.RetentionCancelled == 0 && w.Cancelled == task.KeepForever && w.Dead == 90*time.Minute
			}},
		{"ConsumerName", map[string]string{"INGEST_CONSUMER_NAME": "worker-a"}, nil, func(c *Config) bool { return c.ConsumerName == "worker-a" }},
		{"KeyValueDSN", map[string]string{"INGEST_DATABASE_URL": "host=db user=app password=x dbname=ingest"}, nil, func(c *Config) bool { return strings.HasPrefix(c.DatabaseURL, "host=db") }},
		{"HashTaggedKeys", map[string]string{"INGEST_REDIS_STREAM_KEY": "{ingest}:tasks", "INGEST_REDIS_DLQ_STREAM_KEY": "{ingest}:tasks:dlq"}, nil,
			func(c *Config) bool { return c.StreamKey == "{ingest}:tasks" }},
		{"Cluster", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_URL": "redis://:pw@10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000",
			"INGEST_REDIS_STREAM_KEY": "{ingest}:tasks", "INGEST_REDIS_DLQ_STREAM_KEY": "{ingest}:tasks:dlq"}, nil,
			func(c *Config) bool { return c.RedisCluster && strings.Contains(c.RedisURL, "addr=10.0.0.3:7000") }},
		{"ClusterFlag", map[string]string{"INGEST_REDIS_STREAM_KEY": "a{t}", "INGEST_REDIS_DLQ_STREAM_KEY": "b{t}"},
			[]string{"--redis-cluster", "--redis-url", "rediss://10.0.0.1:7000/0"}, func(c *Config) bool { return c.RedisCluster }},
		{"ClusterWithoutDLQNeedsNoTag", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_DLQ_STREAM_KEY": ""}, nil,
			func(c *Config) bool { return c.RedisCluster && c.DLQStreamKey == "" }},
		{"NotClusterByDefault", nil, nil, func(c *Config) bool { return !c.RedisCluster }},
		{"LogSettings", map[string]string{"INGEST_LOG_LEVEL": "DEBUG", "INGEST_LOG_FORMAT": "json"}, nil,
			func(c *Config) bool { return c.LogLevel == slog.LevelDebug && c.LogFormat == "json" }},
		// The seed's local recipe: retries due at once. The policies are
		// not the zero Policy, so the components keep them instead of
		// taking their defaults.
		{"ZeroBackoffIsAtOnce", map[string]string{"INGEST_REDIS_RETRY_BASE_BACKOFF_MS": "0", "INGEST_REDIS_RETRY_MAX_BACKOFF_MS": "0",
			"INGEST_OUTBOX_RETRY_BASE_BACKOFF_MS": "0", "INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS": "0"}, nil,
			func(c *Config) bool {
				atOnce := backoff.Policy{Jitter: backoff.DefaultJitter}
				return c.taskBackoff() == atOnce && c.outboxBackoff() == atOnce && atOnce.Validate() == nil
			}},
		{"BackoffPolicies", map[string]string{"INGEST_REDIS_RETRY_BASE_BACKOFF_MS": "250", "INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS": "30000"}, nil,
			func(c *Config) bool {
				return c.taskBackoff() == backoff.Policy{Base: 250 * time.Millisecond, Max: 10 * time.Minute, Jitter: 0.1} &&
					c.outboxBackoff() == backoff.Policy{Base: time.Second, Max: 30 * time.Second, Jitter: 0.1}
			}},
		// The seed's local reproduction (5.1), verbatim: it loads, and the
		// reclaim idle below the heartbeat is a warning, not an error.
		{"SeedRecipe", map[string]string{"INGEST_REDIS_MAX_ATTEMPTS": "2", "INGEST_REDIS_RETRY_BASE_BACKOFF_MS": "0",
			"INGEST_REDIS_RETRY_MAX_BACKOFF_MS": "0", "INGEST_REDIS_RECLAIM_IDLE_MS": "0"}, nil,
			func(c *Config) bool {
				return c.MaxAttempts == 2 && c.taskBackoff() == backoff.Policy{Jitter: backoff.DefaultJitter} &&
					c.reclaimIdle() == time.Millisecond && len(c.warnings()) == 1 &&
					strings.Contains(c.warnings()[0], "INGEST_REDIS_RECLAIM_IDLE_MS")
			}},
		{"IdleBelowIntervalWorks", map[string]string{"INGEST_REDIS_RECLAIM_IDLE_MS": "1000", "INGEST_REDIS_RECLAIM_INTERVAL_MS": "5000", "INGEST_TASK_LEASE_MS": "2400"}, nil,
			func(c *Config) bool { return c.reclaimIdle() == time.Second && len(c.warnings()) == 0 }},
		{"ReclaimDisabledSkipsIdleCheck", map[string]string{"INGEST_REDIS_RECLAIM_ENABLED": "false", "INGEST_REDIS_RECLAIM_IDLE_MS": "20000", "INGEST_REDIS_RECLAIM_INTERVAL_MS": "60000"}, nil,
			func(c *Config) bool { return !c.ReclaimEnabled }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, _, err := parse(t, tt.env, tt.flags...)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Fatalf("unexpected config %+v", *c)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	const pw = "hunter2-secret"
	tests := []struct {
		name string
		env  map[string]string
		// want: the variable (and words) the error must name
		want []string
	}{
		{"NonNumeric", map[string]string{"INGEST_WORKER_CONCURRENCY": "many"}, []string{"INGEST_WORKER_CONCURRENCY", "--worker-concurrency", "not a whole number"}},
		{"Negative", map[string]string{"INGEST_REDIS_MAX_ATTEMPTS": "-1"}, []string{"INGEST_REDIS_MAX_ATTEMPTS", "from 1 to 1000000", "got -1"}},
		// Every whole-number setting has an upper bound, its package's:
		// a value beyond it is refused, not narrowed or wrapped.
		{"MaxAttemptsBeyondInt32", map[string]string{"INGEST_REDIS_MAX_ATTEMPTS": "3000000000"}, []string{"INGEST_REDIS_MAX_ATTEMPTS", "from 1 to 1000000", "got 3000000000"}},
		{"KafkaMaxAttemptsHuge", map[string]string{"INGEST_KAFKA_MAX_ATTEMPTS": "4294967297"}, []string{"INGEST_KAFKA_MAX_ATTEMPTS", "from 1 to 1000000"}},
		{"ZeroConcurrency", map[string]string{"INGEST_WORKER_CONCURRENCY": "0"}, []string{"INGEST_WORKER_CONCURRENCY", "from 1 to 100000", "got 0"}},
		{"HugeConcurrency", map[string]string{"INGEST_WORKER_CONCURRENCY": "1000000000000"}, []string{"INGEST_WORKER_CONCURRENCY", "from 1 to 100000", "got 1000000000000"}},
		{"ConcurrencyBeyondInt64", map[string]string{"INGEST_WORKER_CONCURRENCY": "99999999999999999999"}, []string{"INGEST_WORKER_CONCURRENCY", "not a whole number from 1 to 100000"}},
		{"HugeReclaimBatch", map[string]string{"INGEST_REDIS_RECLAIM_BATCH_SIZE": "10001"}, []string{"INGEST_REDIS_RECLAIM_BATCH_SIZE", "from 1 to 10000"}},
		{"WebhookBatchZero", map[string]string{"INGEST_WEBHOOK_BATCH_MAX": "0"}, []string{"INGEST_WEBHOOK_BATCH_MAX", "--webhook-batch-max", "from 1 to 1000", "got 0"}},
		{"WebhookBatchHuge", map[string]string{"INGEST_WEBHOOK_BATCH_MAX": "1001"}, []string{"INGEST_WEBHOOK_BATCH_MAX", "from 1 to 1000"}},
		{"WebhookBatchWaitTooLong", map[string]string{"INGEST_WEBHOOK_BATCH_WAIT_MS": "60001"}, []string{"INGEST_WEBHOOK_BATCH_WAIT_MS", "from 0 to 60000", `"60001"`}},
		{"WebhookBatchWaitNegative", map[string]string{"INGEST_WEBHOOK_BATCH_WAIT_MS": "-1"}, []string{"INGEST_WEBHOOK_BATCH_WAIT_MS", "milliseconds"}},
		{"HugeOutboxBatch", map[string]string{"INGEST_OUTBOX_PUBLISH_BATCH_SIZE": "10001"}, []string{"INGEST_OUTBOX_PUBLISH_BATCH_SIZE", "from 1 to 10000"}},
		{"HugeKafkaBatch", map[string]string{"INGEST_KAFKA_PUBLISH_BATCH_SIZE": "10001"}, []string{"INGEST_KAFKA_PUBLISH_BATCH_SIZE", "from 1 to 10000"}},
		{"HugeOutboxAttempts", map[string]string{"INGEST_OUTBOX_MAX_ATTEMPTS": "3000000000"}, []string{"INGEST_OUTBOX_MAX_ATTEMPTS", "from 1 to 1000000"}},
		{"HugePayloadLimit", map[string]string{"INGEST_MAX_PAYLOAD_BYTES": "4294967296"}, []string{"INGEST_MAX_PAYLOAD_BYTES", "from 2 to 268435455"}},
		{"Zero", map[string]string{"INGEST_REDIS_RECLAIM_BATCH_SIZE": "0"}, []string{"INGEST_REDIS_RECLAIM_BATCH_SIZE"}},
		{"NegativeMillis", map[string]string{"INGEST_TASK_LEASE_MS": "-5"}, []string{"INGEST_TASK_LEASE_MS"}},
		{"FractionalMillis", map[string]string{"INGEST_OUTBOX_PUBLISH_INTERVAL_MS": "1.5"}, []string{"INGEST_OUTBOX_PUBLISH_INTERVAL_MS", "milliseconds"}},
		{"DurationSyntax", map[string]string{"INGEST_SHUTDOWN_TIMEOUT_MS": "30s"}, []string{"INGEST_SHUTDOWN_TIMEOUT_MS"}},
		{"HugeMillis", map[string]string{"INGEST_TASK_TIMEOUT_MS": "99999999999999"}, []string{"INGEST_TASK_TIMEOUT_MS", "at most a year"}},
		{"RetentionNotDuration", map[string]string{"INGEST_RETENTION_SUCCEEDED": "30 days"}, []string{"INGEST_RETENTION_SUCCEEDED", "--retention-succeeded", "Go duration"}},
		{"RetentionNegative", map[string]string{"INGEST_RETENTION_DEAD": "-1h"}, []string{"INGEST_RETENTION_DEAD", "kept forever", "87600h"}},
		{"RetentionTooLong", map[string]string{"INGEST_RETENTION_CANCELLED": "100000h"}, []string{"INGEST_RETENTION_CANCELLED", "87600h"}},
		{"RetentionSubMillisecond", map[string]string{"INGEST_RETENTION_SUCCEEDED": "500us"}, []string{"INGEST_RETENTION_SUCCEEDED", "whole milliseconds"}},
		{"PeriodicNotJSON", map[string]string{"INGEST_PERIODIC": "sync every 30s"}, []string{"INGEST_PERIODIC", "--periodic", "JSON array"}},
		{"PeriodicBadEntry", map[string]string{"INGEST_PERIODIC": `[{"kind":"a","every":"1m"},{"kind":"b","cron":"0 25 * * *"}]`}, []string{"INGEST_PERIODIC", "[1].cron"}},
		{"PeriodicTooOften", map[string]string{"INGEST_PERIODIC": `[{"kind":"a","every":"100ms"}]`}, []string{"INGEST_PERIODIC", "[0].every: must be at least 1s, got 100ms"}},
		{"Bool", map[string]string{"INGEST_REDIS_RECLAIM_ENABLED": "yes please"}, []string{"INGEST_REDIS_RECLAIM_ENABLED"}},
		{"NegativeIdle", map[string]string{"INGEST_REDIS_RECLAIM_IDLE_MS": "-1"}, []string{"INGEST_REDIS_RECLAIM_IDLE_MS", "from 0 to"}},
		{"Queue", map[string]string{"INGEST_QUEUE": "rabbit"}, []string{"INGEST_QUEUE", "redis, kafka"}},
		{"KafkaBrokers", map[string]string{"KAFKA_BOOTSTRAP_SERVERS": "broker1,broker2:9092"}, []string{"KAFKA_BOOTSTRAP_SERVERS", "host:port"}},
		{"KafkaDLQIsTopic", map[string]string{"INGEST_KAFKA_DLQ_TOPIC": "ingest.tasks"}, []string{"INGEST_KAFKA_DLQ_TOPIC", "INGEST_KAFKA_TOPIC"}},
		{"KafkaBackoffOrder", map[string]string{"INGEST_KAFKA_RETRY_BASE_BACKOFF_MS": "5000", "INGEST_KAFKA_RETRY_MAX_BACKOFF_MS": "1000"}, []string{"INGEST_KAFKA_RETRY_MAX_BACKOFF_MS"}},
		{"BackoffOrder", map[string]string{"INGEST_REDIS_RETRY_BASE_BACKOFF_MS": "5000", "INGEST_REDIS_RETRY_MAX_BACKOFF_MS": "1000"}, []string{"INGEST_REDIS_RETRY_MAX_BACKOFF_MS"}},
		{"OutboxBackoffOrder", map[string]string{"INGEST_OUTBOX_RETRY_BASE_BACKOFF_MS": "5000", "INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS": "1000"}, []string{"INGEST_OUTBOX_RETRY_MAX_BACKOFF_MS"}},
		{"RedisScheme", map[string]string{"INGEST_REDIS_URL": "http://" + "u:" + pw + "@cache:6379"}, []string{"INGEST_REDIS_URL", "scheme"}},
		{"RedisNotURL", map[string]string{"INGEST_REDIS_URL": "cache:6379"}, []string{"INGEST_REDIS_URL", "not a valid URL"}},
		{"RedisBadDB", map[string]string{"INGEST_REDIS_URL": "redis://:" + pw + "@cache:6379/x"}, []string{"INGEST_REDIS_URL"}},
		{"DatabaseScheme", map[string]string{"INGEST_DATABASE_URL": "mysql://app:" + pw + "@db/x"}, []string{"INGEST_DATABASE_URL", "scheme"}},
		{"DatabaseMalformed", map[string]string{"INGEST_DATABASE_URL": "postgres://app:" + pw + "@db:notaport/x"}, []string{"INGEST_DATABASE_URL"}},
		{"DatabaseKeyValueMalformed", map[string]string{"INGEST_DATABASE_URL": "host=db password=" + pw + " sslmode=maybe"}, []string{"INGEST_DATABASE_URL"}},
		{"WebhookScheme", map[string]string{"INGEST_WEBHOOK_URL": "ftp://hooks/x"}, []string{"INGEST_WEBHOOK_URL", "http"}},
		{"WebhookNoHost", map[string]string{"INGEST_WEBHOOK_URL": "http:///x"}, []string{"INGEST_WEBHOOK_URL", "no host"}},
		{"HTTPAddr", map[string]string{"INGEST_HTTP_ADDR": "localhost"}, []string{"INGEST_HTTP_ADDR", "host:port"}},
		{"HTTPAddrPort", map[string]string{"INGEST_HTTP_ADDR": "127.0.0.1:99999"}, []string{"INGEST_HTTP_ADDR", "port"}},
		{"AllowedHostsURL", map[string]string{"INGEST_HTTP_ALLOWED_HOSTS": "localhost,https://ingest.example.com/"}, []string{"INGEST_HTTP_ALLOWED_HOSTS", "--http-allowed-hosts", "not a URL"}},
		{"AllowedHostsWildcard", map[string]string{"INGEST_HTTP_ALLOWED_HOSTS": "*.example.com"}, []string{"INGEST_HTTP_ALLOWED_HOSTS", "no other wildcard"}},
		{"EmptyGroup", map[string]string{"INGEST_REDIS_GROUP": " "}, []string{"INGEST_REDIS_GROUP", "empty"}},
		{"ConsumerSpaces", map[string]string{"INGEST_CONSUMER_NAME": "a b"}, []string{"INGEST_CONSUMER_NAME", "white space"}},
		// Names are printed by the CLI and shown on the dashboard.
		{"ConsumerEscape", map[string]string{"INGEST_CONSUMER_NAME": "w\x1b]0;pwned\a"}, []string{"INGEST_CONSUMER_NAME", "control or bidirectional", `\x1b`}},
		{"StreamKeyBidi", map[string]string{"INGEST_REDIS_STREAM_KEY": "tasks\u202e"}, []string{"INGEST_REDIS_STREAM_KEY", `\u202e`}},
		{"DLQKeyNewline", map[string]string{"INGEST_REDIS_DLQ_STREAM_KEY": "dlq\nfake"}, []string{"INGEST_REDIS_DLQ_STREAM_KEY", `\n`}},
		{"SameStreamAndDLQ", map[string]string{"INGEST_REDIS_DLQ_STREAM_KEY": "ingest:tasks"}, []string{"INGEST_REDIS_DLQ_STREAM_KEY", "differ"}},
		{"HashTagMismatch", map[string]string{"INGEST_REDIS_STREAM_KEY": "{ingest}:tasks"}, []string{"INGEST_REDIS_DLQ_STREAM_KEY", "hash tag"}},
		// Redis Cluster: the stream and the DLQ must share a hash tag.
		{"ClusterKeysWithoutHashTag", map[string]string{"INGEST_REDIS_CLUSTER": "true"},
			[]string{"INGEST_REDIS_DLQ_STREAM_KEY", `"ingest:tasks:dlq"`, `"ingest:tasks"`, "share a {hash tag}", "{ingest}:tasks"}},
		{"ClusterKeysDifferentHashTags", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_STREAM_KEY": "{a}:tasks", "INGEST_REDIS_DLQ_STREAM_KEY": "{b}:tasks:dlq"},
			[]string{"INGEST_REDIS_DLQ_STREAM_KEY", "{b}:tasks:dlq", "hash tag"}},
		{"ClusterKeysOnlyStreamTagged", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_STREAM_KEY": "{ingest}:tasks"},
			[]string{"INGEST_REDIS_DLQ_STREAM_KEY", "hash tag"}},
		{"ClusterKeysEmptyHashTag", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_STREAM_KEY": "{}:tasks", "INGEST_REDIS_DLQ_STREAM_KEY": "{}:tasks:dlq"},
			[]string{"INGEST_REDIS_DLQ_STREAM_KEY", "share a {hash tag}"}},
		{"ClusterUnixURL", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_URL": "unix:///run/redis.sock"}, []string{"INGEST_REDIS_URL", "cluster URL", "redis://"}},
		{"ClusterDatabase", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_URL": "redis://:" + pw + "@cache:7000/3"}, []string{"INGEST_REDIS_URL", "database 0", `"3"`}},
		{"ClusterBadAddr", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_URL": "redis://:" + pw + "@cache:7000?addr=cache2"}, []string{"INGEST_REDIS_URL", "addr", "cache2"}},
		{"ClusterUnknownOption", map[string]string{"INGEST_REDIS_CLUSTER": "true", "INGEST_REDIS_URL": "redis://cache:7000?adr=cache2:7000"}, []string{"INGEST_REDIS_URL", "adr"}},
		{"ClusterAddrWithoutClusterMode", map[string]string{"INGEST_REDIS_URL": "redis://cache:7000?addr=cache2:7000"}, []string{"INGEST_REDIS_URL", "addr"}},
		{"ClusterBool", map[string]string{"INGEST_REDIS_CLUSTER": "several"}, []string{"INGEST_REDIS_CLUSTER", "true or false"}},
		{"LogLevel", map[string]string{"INGEST_LOG_LEVEL": "verbose"}, []string{"INGEST_LOG_LEVEL"}},
		{"LogFormat", map[string]string{"INGEST_LOG_FORMAT": "xml"}, []string{"INGEST_LOG_FORMAT"}},
		{"PayloadLimit", map[string]string{"INGEST_MAX_PAYLOAD_BYTES": "1"}, []string{"INGEST_MAX_PAYLOAD_BYTES"}},
		{"SeveralAtOnce", map[string]string{"INGEST_WORKER_CONCURRENCY": "x", "INGEST_REDIS_GROUP": ""}, []string{"INGEST_WORKER_CONCURRENCY"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := parse(t, tt.env)
			if err == nil {
				t.Fatalf("env %v: no error", tt.env)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
}

func TestConfigFlagErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	_, _, err := parse(t, nil, "--redis-reclaim-idle-ms=soon")
	if err == nil || !strings.Contains(err.Error(), "INGEST_REDIS_RECLAIM_IDLE_MS") || !strings.Contains(err.Error(), "--redis-reclaim-idle-ms") {
		t.Fatalf("err = %v, want one naming the variable and the flag", err)
	}
}

func TestConfigDisplayAndSecrets(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"INGEST_DATABASE_URL": "postgres://app:db-secret-1@db/ingest",
		"INGEST_REDIS_URL":    "redis://:redis-secret-2@cache:6379/0",
		"INGEST_API_TOKEN":    "api-token-3",
		"INGEST_WEBHOOK_URL":  "https://hooks.example/in?token=hook-secret-4",
	}
	_, all, err := parse(t, env)
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]bool{}
	for _, s := range secretsOf(all) {
		secrets[s] = true
	}
	for _, s := range []string{"db-secret-1", "redis-secret-2", "api-token-3", "hook-secret-4"} {
		if !secrets[s] {
			t.Errorf("secretsOf misses %q (got %v)", s, secrets)
		}
	}
	for _, r := range all {
		for s := range secrets {
			if strings.Contains(r.display(), s) {
				t.Errorf("%s is displayed as %q, showing a secret", r.env, r.display())
			}
		}
	}
}

func TestConfigCommandOutputHidesSecrets(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"INGEST_DATABASE_URL": "postgres://app:db-secret-1@db/ingest",
		"INGEST_API_TOKEN":    "api-token-3",
		"INGEST_LOG_LEVEL":    "debug",
	}
	var stdout, stderr bytes.Buffer
	code := execute(context.Background(), []string{"config"}, strings.NewReader(""), &stdout, &stderr, envOf(env))
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String() + stderr.String()
	if strings.Contains(out, "db-secret-1") || strings.Contains(out, "api-token-3") {
		t.Fatalf("config output shows a secret:\n%s", out)
	}
	if !strings.Contains(out, "INGEST_DATABASE_URL") || !strings.Contains(out, "postgres://app:xxxxx@db/ingest") {
		t.Fatalf("config output lacks the redacted database URL:\n%s", out)
	}
}

func TestLoggerScrubsSecrets(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		_, all, err := parse(t, map[string]string{"INGEST_DATABASE_URL": "postgres://app:db-secret-1@db/x"})
		if err != nil {
			t.Fatal(err)
		}
		log := newLogger(&buf, slog.LevelInfo, format, newScrubberFor(all))
		log.Info("connecting to postgres://app:db-secret-1@db/x", "dsn", "postgres://app:db-secret-1@db/x", "err", errString("auth db-secret-1 failed"))
		if strings.Contains(buf.String(), "db-secret-1") {
			t.Fatalf("%s log shows the secret: %s", format, buf.String())
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestErrorsHideUnescapedPasswords: a password with an unescaped "@" is
// split by the drivers at its first "@", and its tail comes back inside
// their errors as a host name; no command prints any piece of it.
func TestErrorsHideUnescapedPasswords(t *testing.T) {
	t.Parallel()
	port := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"PostgreSQL", map[string]string{"INGEST_DATABASE_URL": "postgres://postgres:p@ssSECRET@127.0.0.1:" + port + "/ingest"}, []string{"task", "list"}},
		{"PostgreSQLUnparsable", map[string]string{"INGEST_DATABASE_URL": "postgres://postgres:p@ssSECRET@127.0.0.1:" + port + "/ingest?x=%zz"}, []string{"task", "list"}},
		{"Redis", map[string]string{"INGEST_DATABASE_URL": testenv.NewDatabase(t).URL,
			"INGEST_REDIS_URL": "redis://:r@disSECRET@127.0.0.1:" + port + "/0"}, []string{"pending"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := execute(context.Background(), tc.args, strings.NewReader(""), &stdout, &stderr, envOf(tc.env))
			out := stdout.String() + stderr.String()
			if code == exitOK {
				t.Fatalf("%v succeeded against a closed port:\n%s", tc.args, out)
			}
			for _, leak := range []string{"SECRET", "ssSECRET", "disSECRET"} {
				if strings.Contains(out, leak) {
					t.Fatalf("%v shows %q of the password:\n%s", tc.args, leak, out)
				}
			}
		})
	}
}

// TestRedisClientLogsThroughTheLogger: go-redis's own lines (a pool that
// cannot dial) come out as the process's log lines, JSON with
// --log-format json, never in go-redis's format ("redis: 2026/11/25 …").
func TestRedisClientLogsThroughTheLogger(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	env := []string{"INGEST_DATABASE_URL=" + testenv.NewDatabase(t).URL, "INGEST_REDIS_URL=redis://" + freeAddr(t) + "/0"}
	r := runBin(t, bin, env, "", "pending", "--log-format", "json")
	if r.code == exitOK {
		t.Fatalf("pending succeeded without Redis:\n%s", r.stderr)
	}
	fromRedis := 0
	for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		if strings.HasPrefix(line, "ingest-worker: ") {
			continue // the command's own error
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a stderr line is not a JSON log line: %q\n%s", line, r.stderr)
		}
		if rec["component"] == "go-redis" && rec["level"] == "WARN" {
			fromRedis++
		}
	}
	if fromRedis == 0 {
		t.Fatalf("no go-redis line came through the logger:\n%s", r.stderr)
	}
}
