package stream

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// RedisLogger carries go-redis's own log lines (a pool that cannot dial,
// a connection it dropped) into a slog.Logger, at level WARN with the
// attribute component=go-redis, so that they take the process's format (JSON
// logs stay JSON) and its scrubbing of secrets. Without it go-redis prints
// them to stderr in a format of its own. go-redis has one logger per
// process: install it once, with redis.SetLogger(stream.RedisLogger{Logger: l}).
type RedisLogger struct {
	Logger *slog.Logger
}

// Printf logs one go-redis line.
func (l RedisLogger) Printf(ctx context.Context, format string, v ...any) {
	if l.Logger == nil {
		return
	}
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	l.Logger.WarnContext(ctx, msg, "component", "go-redis")
}
