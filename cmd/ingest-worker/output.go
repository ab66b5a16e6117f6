package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/humantime"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/pguuid"
	"github.com/ingest-worker/ingest/task"
)

// printJSON writes v as indented JSON to stdout. The encoder escapes the
// controls below U+0020; termsafe.JSON escapes the rest a terminal would
// act on (DEL, C1 and bidirectional controls) as \uXXXX, which decode to
// the same strings.
func (a *app) printJSON(v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := a.stdout.Write(termsafe.JSON(buf.Bytes()))
	return err
}

// table writes a table with a header row to stdout. Every cell is shown
// through termsafe.String: data from PostgreSQL or Redis (a kind, an
// error, a consumer name) can neither drive the terminal nor break the
// table's lines.
func (a *app) table(header []string, rows [][]string) {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	line := func(cells []string) {
		safe := make([]string, len(cells))
		for i, c := range cells {
			safe[i] = termsafe.String(c)
		}
		fmt.Fprintln(tw, strings.Join(safe, "\t"))
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
	tw.Flush()
}

// printf writes human output to stdout; each argument is shown through
// termsafe.String (the format is the program's own).
func (a *app) printf(format string, args ...any) { fmt.Fprintf(a.stdout, format, shown(args)...) }

// notef writes a note for people to stderr (kept out of stdout, which
// scripts read), its arguments shown as printf shows them.
func (a *app) notef(format string, args ...any) { fmt.Fprintf(a.stderr, format, shown(args)...) }

// shown wraps format arguments so that each prints as the terminal-safe
// form of what it would print (termsafe.String).
func shown(args []any) []any {
	out := make([]any, len(args))
	for i, v := range args {
		out[i] = safeArg{v}
	}
	return out
}

// safeArg formats its value with the verb and flags it is given, then
// escapes the result for a terminal.
type safeArg struct{ v any }

func (s safeArg) Format(f fmt.State, verb rune) {
	_, _ = io.WriteString(f, termsafe.String(fmt.Sprintf(fmt.FormatString(f, verb), s.v)))
}

// clip shortens s to n runes on one line.
func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// ago says how long ago t was, "3.2s ago" ("in 1.0s" for a time ahead,
// "" for the zero time).
func ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return humantime.Relative(t, time.Now())
}

func timeOrEmpty(t *time.Time) string {
	if t == nil {
		return ""
	}
	return t.Local().Format(time.DateTime)
}

// openDB connects to PostgreSQL and checks the connection.
func (a *app) openDB(ctx context.Context) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(a.cfg.DatabaseURL)
	if err != nil {
		return nil, usagef("INGEST_DATABASE_URL: %s is not a valid connection string", redact.DSN(a.cfg.DatabaseURL))
	}
	if pc.ConnConfig.RuntimeParams["application_name"] == "" {
		pc.ConnConfig.RuntimeParams["application_name"] = "ingest-worker"
	}
	pc.MaxConns = max(pc.MaxConns, int32(min(a.cfg.WorkerConcurrency/2+4, 64)))
	pc.AfterConnect = pguuid.AfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL %s: %w", a.dbShown(), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL %s: %w", a.dbShown(), err)
	}
	return a.behindPooler(pctx, pc, pool)
}

// dbShown names the database for messages, without its password.
func (a *app) dbShown() string {
	if a.cfg.DatabaseURL == "" {
		return "(from the PG* environment variables)"
	}
	return redact.DSN(a.cfg.DatabaseURL)
}

// openRedis connects to Redis, or to Redis Cluster with
// INGEST_REDIS_CLUSTER, and checks the connection (of every master, on a
// cluster).
func (a *app) openRedis(ctx context.Context) (redis.UniversalClient, error) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if a.cfg.RedisCluster {
		opt, err := redis.ParseClusterURL(a.cfg.RedisURL)
		if err != nil {
			return nil, usagef("INGEST_REDIS_URL: %s is not a valid Redis Cluster URL", redact.DSN(a.cfg.RedisURL))
		}
		opt.PoolSize = max(opt.PoolSize, a.cfg.WorkerConcurrency+8)
		// A failed master refuses connections and sends no MOVED: only a
		// reload of the slot map finds the replica that took over its
		// slots. go-redis reloads every minute by default.
		opt.ClusterStateReloadInterval = time.Second
		rdb := redis.NewClusterClient(opt)
		err = rdb.ForEachMaster(pctx, func(ctx context.Context, c *redis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("%s: %w", c.Options().Addr, err)
			}
			return nil
		})
		if err != nil {
			rdb.Close()
			return nil, fmt.Errorf("connect to Redis Cluster %s: %w", redact.DSN(a.cfg.RedisURL), err)
		}
		return rdb, nil
	}
	opt, err := redis.ParseURL(a.cfg.RedisURL)
	if err != nil {
		return nil, usagef("INGEST_REDIS_URL: %s is not a valid Redis URL", redact.DSN(a.cfg.RedisURL))
	}
	opt.PoolSize = max(opt.PoolSize, a.cfg.WorkerConcurrency+8)
	rdb := redis.NewClient(opt)
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("connect to Redis %s: %w", redact.DSN(a.cfg.RedisURL), err)
	}
	return rdb, nil
}

// forEachRedisNode calls fn with the client of every master of a cluster,
// or with rdb itself.
func forEachRedisNode(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, c *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("unsupported Redis client %T", rdb)
}

// openServers connects to PostgreSQL and Redis; closeAll closes both.
func (a *app) openServers(ctx context.Context) (pool *pgxpool.Pool, rdb redis.UniversalClient, closeAll func(), err error) {
	if pool, err = a.openDB(ctx); err != nil {
		return nil, nil, nil, err
	}
	if rdb, err = a.openRedis(ctx); err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return pool, rdb, func() { rdb.Close(); pool.Close() }, nil
}

// storeConfig is the task store's configuration (the queue mode's).
func (a *app) storeConfig() task.Config { return a.mode().storeConfig() }

// openStore connects to PostgreSQL and returns the task store on it.
func (a *app) openStore(ctx context.Context) (*task.Store, *pgxpool.Pool, error) {
	pool, err := a.openDB(ctx)
	if err != nil {
		return nil, nil, err
	}
	store, err := task.NewStore(a.storeConfig(), pool)
	if err != nil {
		pool.Close()
		return nil, nil, usageErr(err)
	}
	return store, pool, nil
}
