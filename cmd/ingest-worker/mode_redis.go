package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
)

// redisMode is the Redis queue mode (INGEST_QUEUE=redis): a Redis Stream
// consumer group carries the tasks.
type redisMode struct{ a *app }

func (m redisMode) service(ctx context.Context, pool *pgxpool.Pool, rdb redis.UniversalClient, _ ...kgo.Opt) (ingest.Config, ingest.Queue, error) {
	a, c := m.a, m.a.cfg
	if err := a.startupChecks(ctx, pool, rdb); err != nil {
		return ingest.Config{}, nil, err
	}
	for _, w := range c.warnings() {
		a.log.Warn(w)
	}
	return ingest.Config{
		Stream:          c.StreamKey,
		Group:           c.Group,
		DLQ:             c.DLQStreamKey,
		NoDLQ:           c.DLQStreamKey == "",
		ReclaimIdle:     c.reclaimIdle(),
		Store:           m.storeConfig(),
		Reclaim:         reclaim.Config{Interval: c.ReclaimInterval, BatchSize: c.ReclaimBatchSize},
		ReclaimDisabled: !c.ReclaimEnabled,
		Relay: outbox.RelayConfig{
			BatchSize: c.OutboxPublishBatchSize, PublishInterval: c.OutboxPublishInterval,
			MaxAttempts: c.OutboxMaxAttempts, Backoff: c.outboxBackoff(),
		},
	}, ingest.Redis(rdb), nil
}

func (m redisMode) storeConfig() task.Config {
	c := m.a.cfg
	return task.Config{
		Stream:          c.StreamKey,
		MaxAttempts:     c.MaxAttempts,
		MaxPayloadBytes: c.MaxPayloadBytes,
		MaxResultBytes:  c.MaxResultBytes,
		Backoff:         c.taskBackoff(),
		Keyring:         c.Keyring,
	}
}

func (m redisMode) openServers(ctx context.Context) (*pgxpool.Pool, redis.UniversalClient, func(), error) {
	return m.a.openServers(ctx)
}

func (m redisMode) dlqStream() string { return m.a.cfg.DLQStreamKey }

func (m redisMode) runAttrs() []any {
	a, c := m.a, m.a.cfg
	return []any{"consumer", c.ConsumerName, "stream", c.StreamKey, "group", c.Group,
		"concurrency", c.WorkerConcurrency, "redis", redact.DSN(c.RedisURL), "database", a.dbShown()}
}

func (m redisMode) pending(ctx context.Context, oldest int64) error {
	a := m.a
	pool, rdb, closeAll, err := a.openServers(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	rep, err := a.pendingReport(ctx, pool, rdb, oldest)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(rep)
	}
	a.printPending(rep)
	return nil
}

func (m redisMode) showQueue(ctx context.Context, d *taskDetail) {
	a := m.a
	rdb, err := a.openRedis(ctx)
	if err != nil {
		d.Redis.Error = a.scrub.String(err.Error())
		return
	}
	defer rdb.Close()
	if err := a.redisStateOf(ctx, rdb, d); err != nil {
		d.Redis.Error = a.scrub.String(err.Error())
	}
}

// demoServers starts an in-process Redis (miniredis) unless
// INGEST_REDIS_URL is set.
func (m redisMode) demoServers(say func(string, ...any)) (string, func(), error) {
	c := m.a.cfg
	if m.a.setByUser("INGEST_REDIS_URL") {
		cli := "redis-cli -u '" + redact.DSN(c.RedisURL) + "'"
		if c.RedisCluster { // one node, following redirects (-c)
			first, _, _ := strings.Cut(c.RedisURL, "?")
			cli = "redis-cli -c -u '" + redact.DSN(first) + "'"
		}
		say("Redis:      %s\n", redact.DSN(c.RedisURL))
		return cli, func() {}, nil
	}
	r := miniredis.NewMiniRedis()
	if err := r.StartAddr("127.0.0.1:0"); err != nil {
		return "", nil, fmt.Errorf("start the in-process Redis: %w", err)
	}
	c.RedisURL, c.RedisCluster = "redis://"+r.Addr()+"/0", false
	say("Redis:      in-process (miniredis) on %s\n", r.Addr())
	return "redis-cli -p " + r.Port(), r.Close, nil
}

// demoDLQ reads the DLQ stream's entries of the demo's tasks.
func (m redisMode) demoDLQ(ctx context.Context, rdb redis.UniversalClient, ids []uuid.UUID) ([]dlq.Entry, error) {
	out := []dlq.Entry{}
	key := m.a.cfg.DLQStreamKey
	if key == "" {
		return out, nil
	}
	idSet := make(map[string]bool, len(ids))
	for _, id := range ids {
		idSet[id.String()] = true
	}
	entries, err := dlq.List(ctx, rdb, key, dlq.ListParams{Count: 1000})
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if idSet[e.TaskID] {
			out = append(out, e)
		}
	}
	return out, nil
}

func (m redisMode) demoCommands(cli string, sum *demoSummary) []string {
	s, g, d := m.a.cfg.StreamKey, m.a.cfg.Group, m.a.cfg.DLQStreamKey
	cmds := []string{
		fmt.Sprintf("%s XPENDING %s %s", cli, s, g),
		fmt.Sprintf("%s XINFO GROUPS %s", cli, s),
		// Not XRANGE of the task stream: retention trims the entries
		// every group has acknowledged, so after the demo it is empty.
		// XINFO STREAM counts every entry ever added.
		fmt.Sprintf("%s XINFO STREAM %s", cli, s),
	}
	if d != "" && len(sum.DLQ) > 0 {
		cmds = append(cmds, fmt.Sprintf("%s XRANGE %s - + COUNT 5", cli, d))
	}
	return cmds
}

func (m redisMode) demoEnv() string {
	return fmt.Sprintf("INGEST_DATABASE_URL='%s' INGEST_REDIS_URL='%s'", redact.DSN(m.a.cfg.DatabaseURL), redact.DSN(m.a.cfg.RedisURL))
}

func (m redisMode) dlqName() string { return m.a.cfg.DLQStreamKey }
