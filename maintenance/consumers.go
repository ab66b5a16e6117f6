package maintenance

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/stream"
)

//go:embed delete_idle_consumers.lua
var deleteIdleConsumersLua string

var deleteIdleConsumers = redis.NewScript(deleteIdleConsumersLua)

// maxConsumersPerCall bounds the consumers one script call removes, so a
// group with very many dead consumers does not block Redis for long; the
// rest go in the next calls.
const maxConsumersPerCall = 1000

// consumers removes the consumers of the group that have been idle for at
// least IdleTimeout and have no pending entries, except this process's
// own.
//
// The check (XINFO CONSUMERS: pending and idle) and XGROUP DELCONSUMER run
// in one Lua script, so no entry can become pending between them and
// DELCONSUMER never drops one. Should it ever report dropped entries, they
// are logged as an error and counted: their ids are gone from the PEL and
// cannot be listed any more, so their tasks are left to the rescuer (due
// tasks whose stream entry is gone).
type consumers struct {
	cfg     ConsumersConfig
	rdb     redis.UniversalClient
	logger  *slog.Logger
	metrics *metrics
}

func newConsumers(cfg ConsumersConfig, rdb redis.UniversalClient, logger *slog.Logger, m *metrics) *consumers {
	return &consumers{cfg: cfg, rdb: rdb, logger: logger, metrics: m}
}

// service is the cleanup as the maintainer runs it.
func (c *consumers) service() *service {
	return &service{
		name:     "consumers",
		interval: c.cfg.Interval,
		msg:      "removed idle consumers",
		pass: func(ctx context.Context) ([]any, error) {
			n, err := c.runOnce(ctx)
			if n == 0 {
				return nil, err
			}
			return []any{"removed", n, "idle_timeout", c.cfg.IdleTimeout}, err
		},
		failed: func() { c.metrics.consumerErrors.Inc() },
	}
}

// runOnce removes the idle consumers and returns how many it removed.
func (c *consumers) runOnce(ctx context.Context) (int, error) {
	total := 0
	for ctx.Err() == nil {
		reply, err := deleteIdleConsumers.Run(ctx, c.rdb, []string{c.cfg.Stream},
			c.cfg.Group, c.cfg.Consumer, c.cfg.IdleTimeout.Milliseconds(), maxConsumersPerCall).Slice()
		if err != nil {
			if stream.IsMissing(err) {
				return total, nil // nothing to clean; the consumers recreate the group
			}
			return total, fmt.Errorf("delete idle consumers of %s/%s: %w", c.cfg.Stream, c.cfg.Group, err)
		}
		removed := len(reply) / 2
		for i := 0; i+1 < len(reply); i += 2 {
			name, _ := reply[i].(string)
			dropped, _ := reply[i+1].(int64)
			if dropped > 0 {
				c.metrics.consumerErrors.Inc()
				c.logger.Error("XGROUP DELCONSUMER dropped pending entries of an idle consumer: their tasks wait for the rescuer",
					"idle_consumer", name, "dropped", dropped)
			}
		}
		total += removed
		if removed < maxConsumersPerCall {
			return total, nil
		}
	}
	return total, nil
}
