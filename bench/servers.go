package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/pgtemp"
)

// Servers are throwaway servers a bench runs against when none are
// configured.
type Servers struct {
	// DatabaseURL / RedisURL are set for the servers started ("" for those
	// not asked for).
	DatabaseURL string
	RedisURL    string
	// Postgres and Redis describe the servers for people.
	Postgres string
	Redis    string

	pg     *pgtemp.Server
	redis  *exec.Cmd
	rdir   string
	mini   *miniredis.Miniredis
	closed bool
}

// StartServers starts a throwaway PostgreSQL (durable: fsync and
// synchronous_commit on, as in production) when postgres is set, and a
// Redis when redis is set: a redis-server child on a free port if one is on
// PATH, else an in-process miniredis. Close stops them.
func StartServers(ctx context.Context, postgres, redisToo bool) (*Servers, error) {
	s := &Servers{}
	if postgres {
		pg, err := pgtemp.StartWith(pgtemp.Options{Durable: true})
		if err != nil {
			return nil, err
		}
		s.pg = pg
		conn, err := pgx.Connect(ctx, pg.URL("postgres"))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("connect to the throwaway PostgreSQL: %w", err)
		}
		_, err = conn.Exec(ctx, "CREATE DATABASE ingest_bench")
		_ = conn.Close(ctx)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("create database ingest_bench: %w", err)
		}
		s.DatabaseURL = pg.URL("ingest_bench")
		s.Postgres = fmt.Sprintf("throwaway PostgreSQL on port %d (fsync=on, synchronous_commit=on; data in %s)", pg.Port, pg.Dir)
	}
	if redisToo {
		if err := s.startRedis(ctx); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *Servers) startRedis(ctx context.Context) error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return fmt.Errorf("start an in-process Redis: %w", err)
		}
		s.mini = m
		s.RedisURL = "redis://" + m.Addr() + "/0"
		s.Redis = "in-process miniredis on " + m.Addr() + " (no redis-server on PATH: numbers are not representative)"
		return nil
	}
	port, err := pgtemp.FreePort()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ingest-bench-redis-")
	if err != nil {
		return err
	}
	s.rdir = dir
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", dir+"/redis.log")
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.redis = cmd
	go func() { _ = cmd.Wait() }()
	s.RedisURL = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	s.Redis = fmt.Sprintf("throwaway redis-server on port %d (no persistence)", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
		err := c.Ping(ctx).Err()
		_ = c.Close()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis-server on port %d did not answer: %w", port, errors.Join(err, ctx.Err()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops the servers and removes their data.
func (s *Servers) Close() {
	if s == nil || s.closed {
		return
	}
	s.closed = true
	if s.pg != nil {
		_ = s.pg.Close()
	}
	if s.redis != nil && s.redis.Process != nil {
		_ = s.redis.Process.Kill()
	}
	if s.rdir != "" {
		_ = os.RemoveAll(s.rdir)
	}
	if s.mini != nil {
		s.mini.Close()
	}
}
