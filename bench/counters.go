package bench

import (
	"context"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Counters counts the SQL statements (a pgx.QueryTracer: every Query and
// Exec, BEGIN and COMMIT included, each one round trip) and the Redis round
// trips (a go-redis hook: one per command sent alone, one per pipeline) of
// the clients they are attached to.
type Counters struct {
	sql       atomic.Int64
	redis     atomic.Int64
	statement sync.Map // SQL text → *atomic.Int64
	command   sync.Map // Redis command name (or "pipeline") → *atomic.Int64
}

// Snapshot is the counters at one moment.
type Snapshot struct {
	SQL   int64
	Redis int64
	// ByStatement counts SQL statements by a short name of their text;
	// ByCommand counts Redis round trips by command ("pipeline[XACK+…]"
	// for pipelines).
	ByStatement map[string]int64
	ByCommand   map[string]int64
}

// Sub returns s - o.
func (s Snapshot) Sub(o Snapshot) Snapshot {
	d := Snapshot{SQL: s.SQL - o.SQL, Redis: s.Redis - o.Redis, ByStatement: map[string]int64{}, ByCommand: map[string]int64{}}
	for k, v := range s.ByStatement {
		if v -= o.ByStatement[k]; v != 0 {
			d.ByStatement[k] = v
		}
	}
	for k, v := range s.ByCommand {
		if v -= o.ByCommand[k]; v != 0 {
			d.ByCommand[k] = v
		}
	}
	return d
}

// Snapshot returns the current counts.
func (c *Counters) Snapshot() Snapshot {
	s := Snapshot{SQL: c.sql.Load(), Redis: c.redis.Load(), ByStatement: map[string]int64{}, ByCommand: map[string]int64{}}
	c.statement.Range(func(k, v any) bool {
		s.ByStatement[statementName(k.(string))] += v.(*atomic.Int64).Load()
		return true
	})
	c.command.Range(func(k, v any) bool {
		s.ByCommand[k.(string)] += v.(*atomic.Int64).Load()
		return true
	})
	return s
}

func bump(m *sync.Map, key string) {
	v, ok := m.Load(key)
	if !ok {
		v, _ = m.LoadOrStore(key, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(1)
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *Counters) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.sql.Add(1)
	bump(&c.statement, data.SQL)
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Counters) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// RedisHook returns a go-redis hook counting round trips into c.
func (c *Counters) RedisHook() redis.Hook { return redisHook{c} }

type redisHook struct{ c *Counters }

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.c.redis.Add(1)
		bump(&h.c.command, strings.ToUpper(cmd.Name()))
		return next(ctx, cmd)
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.c.redis.Add(1)
		names := map[string]bool{}
		for _, c := range cmds {
			names[strings.ToUpper(c.Name())] = true
		}
		list := make([]string, 0, len(names))
		for n := range names {
			list = append(list, n)
		}
		sort.Strings(list)
		bump(&h.c.command, "pipeline["+strings.Join(list, "+")+"]")
		return next(ctx, cmds)
	}
}

// statementName shortens SQL text to its first words, white space
// collapsed: "WITH locked AS ( SELECT * FROM ingest_task WHERE …".
func statementName(sql string) string {
	f := strings.Fields(sql)
	s := strings.Join(f, " ")
	if len(s) > 72 {
		s = s[:72] + "…"
	}
	return s
}
