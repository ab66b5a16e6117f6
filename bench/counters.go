package bench

import (
	"context"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// timed counts the timed statements and batches and nanos sums
	// their time, from the start to the end as the client saw them
	// (SQL text, or "batch: " and the text of a batch's last statement
	// → *atomic.Int64).
	timed   sync.Map
	nanos   sync.Map
	command sync.Map // Redis command name (or "pipeline") → *atomic.Int64
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
	// Timed sums the time of each statement as the client saw it (round
	// trip and waits in the server included), and of each batch
	// ("batch: " and its last statement; batches are not counted in SQL
	// and ByStatement).
	Timed map[string]Timing
	// Deletes sums the timed statements that delete rows (their text
	// holds "DELETE FROM"): in a run, retention's.
	Deletes Timing
}

// Timing is how many times a statement ran and their total time.
type Timing struct {
	N int64
	D time.Duration
}

// Sub returns s - o.
func (s Snapshot) Sub(o Snapshot) Snapshot {
	d := Snapshot{SQL: s.SQL - o.SQL, Redis: s.Redis - o.Redis, ByStatement: map[string]int64{}, ByCommand: map[string]int64{},
		Timed: map[string]Timing{}}
	for k, v := range s.ByStatement {
		if v -= o.ByStatement[k]; v != 0 {
			d.ByStatement[k] = v
		}
	}
	d.Deletes = Timing{N: s.Deletes.N - o.Deletes.N, D: s.Deletes.D - o.Deletes.D}
	for k, v := range s.Timed {
		if v.N -= o.Timed[k].N; v.N != 0 {
			v.D -= o.Timed[k].D
			d.Timed[k] = v
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
	s := Snapshot{SQL: c.sql.Load(), Redis: c.redis.Load(), ByStatement: map[string]int64{}, ByCommand: map[string]int64{},
		Timed: map[string]Timing{}}
	c.statement.Range(func(k, v any) bool {
		s.ByStatement[statementName(k.(string))] += v.(*atomic.Int64).Load()
		return true
	})
	c.timed.Range(func(k, v any) bool {
		name := k.(string)
		short := statementName(name)
		if rest, ok := strings.CutPrefix(name, batchPrefix); ok {
			short = batchPrefix + statementName(rest)
		}
		var one Timing
		one.N = v.(*atomic.Int64).Load()
		if d, ok := c.nanos.Load(name); ok {
			one.D = time.Duration(d.(*atomic.Int64).Load())
		}
		t := s.Timed[short]
		t.N, t.D = t.N+one.N, t.D+one.D
		s.Timed[short] = t
		if strings.Contains(name, "DELETE FROM") {
			s.Deletes.N, s.Deletes.D = s.Deletes.N+one.N, s.Deletes.D+one.D
		}
		return true
	})
	c.command.Range(func(k, v any) bool {
		s.ByCommand[k.(string)] += v.(*atomic.Int64).Load()
		return true
	})
	return s
}

func bump(m *sync.Map, key string) { add(m, key, 1) }

func add(m *sync.Map, key string, n int64) {
	v, ok := m.Load(key)
	if !ok {
		v, _ = m.LoadOrStore(key, new(atomic.Int64))
	}
	v.(*atomic.Int64).Add(n)
}

// queryStart is what TraceQueryStart leaves for TraceQueryEnd.
type queryStart struct {
	sql string
	at  time.Time
}

type queryStartKey struct{}

// TraceQueryStart implements pgx.QueryTracer.
func (c *Counters) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.sql.Add(1)
	bump(&c.statement, data.SQL)
	return context.WithValue(ctx, queryStartKey{}, queryStart{data.SQL, time.Now()})
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Counters) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if q, ok := ctx.Value(queryStartKey{}).(queryStart); ok {
		c.time(q)
	}
}

func (c *Counters) time(q queryStart) {
	add(&c.nanos, q.sql, int64(time.Since(q.at)))
	bump(&c.timed, q.sql)
}

// batchPrefix names a batch in Snapshot.Timed.
const batchPrefix = "batch: "

// TraceBatchStart implements pgx.BatchTracer: a batch is timed, not
// counted, under its last statement (the one a batch exists for; those
// before it set up its transaction).
func (c *Counters) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	sql := ""
	if data.Batch != nil && len(data.Batch.QueuedQueries) > 0 {
		sql = data.Batch.QueuedQueries[len(data.Batch.QueuedQueries)-1].SQL
	}
	return context.WithValue(ctx, queryStartKey{}, queryStart{batchPrefix + sql, time.Now()})
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c *Counters) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *Counters) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if q, ok := ctx.Value(queryStartKey{}).(queryStart); ok {
		c.time(q)
	}
}

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
