package reclaim

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed delete_idle_consumers.lua
var deleteIdleConsumersLua string

var deleteIdleConsumers = redis.NewScript(deleteIdleConsumersLua)

// maxConsumersPerCall bounds the consumers one script call removes, so a
// group with very many dead consumers does not block Redis for long; the
// rest go in the next calls.
const maxConsumersPerCall = 1000

// removeIdleConsumers removes the consumers of the group that have been idle
// for at least ConsumerIdleTimeout and have no pending entries, except this
// process's own, and returns how many it removed.
//
// The check (XINFO CONSUMERS: pending and idle) and XGROUP DELCONSUMER run
// in one Lua script, so no entry can become pending between them and
// DELCONSUMER never drops one. Should it ever report dropped entries, they
// are logged as an error and counted: their ids are gone from the PEL and
// cannot be listed any more, so their tasks are left to the outbox rescuer
// (due tasks whose stream entry is gone).
func (r *Reclaimer) removeIdleConsumers(ctx context.Context) (int, error) {
	total := 0
	for ctx.Err() == nil {
		reply, err := deleteIdleConsumers.Run(ctx, r.rdb, []string{r.cfg.Stream},
			r.cfg.Group, r.cfg.Consumer, r.cfg.ConsumerIdleTimeout.Milliseconds(), maxConsumersPerCall).Slice()
		if err != nil {
			if isMissingGroup(err) {
				return total, nil // nothing to clean; claim reports the missing group
			}
			return total, fmt.Errorf("delete idle consumers of %s/%s: %w", r.cfg.Stream, r.cfg.Group, err)
		}
		removed := len(reply) / 2
		for i := 0; i+1 < len(reply); i += 2 {
			name, _ := reply[i].(string)
			dropped, _ := reply[i+1].(int64)
			if dropped > 0 {
				r.metrics.add(resultError, 1)
				r.logger.Error("XGROUP DELCONSUMER dropped pending entries of an idle consumer: their tasks wait for the outbox rescuer",
					"idle_consumer", name, "dropped", dropped)
			}
		}
		total += removed
		if removed > 0 {
			r.logger.Info("removed idle consumers", "removed", removed, "idle_timeout", r.cfg.ConsumerIdleTimeout)
		}
		if removed < maxConsumersPerCall {
			return total, nil
		}
	}
	return total, nil
}

// isMissingGroup reports whether err says the stream or the group does not
// exist (the script's XINFO CONSUMERS failed).
func isMissingGroup(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "NOGROUP") || strings.Contains(strings.ToLower(msg), "no such key")
}
