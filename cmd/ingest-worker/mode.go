package main

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/task"
)

// Values of INGEST_QUEUE.
const (
	queueRedis = "redis"
	queueKafka = "kafka"
)

// queueMode is what the commands need to know of the queue mode
// (INGEST_QUEUE): redisMode (mode_redis.go) or kafkaMode (kafka.go). The
// commands ask it instead of looking at INGEST_QUEUE themselves.
type queueMode interface {
	// service runs the mode's startup checks and returns the queue with
	// the mode's part of the service configuration (the queue's identity,
	// the store's retry policy, the reclaimer and relay settings); opts
	// are extra franz-go client options (Kafka mode; tests).
	service(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient, opts ...kgo.Opt) (ingest.Config, ingest.Queue, error)
	// storeConfig is the task store's configuration.
	storeConfig() task.Config
	// openServers connects to what the mode needs: PostgreSQL, and Redis
	// in Redis mode (rdb nil in Kafka mode); closeAll closes them.
	openServers(ctx context.Context) (pool *pgxpool.Pool, rdb redis.UniversalClient, closeAll func(), err error)
	// dlqStream is the DLQ stream whose entries of deleted or redriven
	// tasks are removed: "" when there is none (Kafka mode, no DLQ).
	dlqStream() string
	// runAttrs are the attributes of the log line "ingest-worker running".
	runAttrs() []any
	// pending prints the queue's side of `pending`.
	pending(ctx context.Context, oldest int64) error
	// showQueue fills in the queue's side of `task show`.
	showQueue(ctx context.Context, d *taskDetail)

	// demoServers starts the demo's in-process queue servers unless they
	// are configured, saying which it uses; cli is the command line that
	// inspects them ("" in Kafka mode); stop stops them.
	demoServers(say func(string, ...any)) (cli string, stop func(), err error)
	// demoDLQ are the DLQ entries of the demo's tasks (never nil).
	demoDLQ(ctx context.Context, rdb redis.UniversalClient, ids []uuid.UUID) ([]dlq.Entry, error)
	// demoCommands are the commands that look at the queue after the
	// demo; cli is what demoServers returned.
	demoCommands(cli string, sum *demoSummary) []string
	// demoEnv is the environment the demo's follow-up commands need.
	demoEnv() string
	// dlqName names the DLQ in the demo's summary.
	dlqName() string
}

// mode is the one place the binary picks its queue mode (INGEST_QUEUE).
func (a *app) mode() queueMode {
	if a.cfg.Queue == queueKafka {
		return kafkaMode{a}
	}
	return redisMode{a}
}
