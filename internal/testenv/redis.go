package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// RedisServer is a throwaway redis-server child process without persistence.
type RedisServer struct {
	Port int
	Dir  string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Addr returns host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL returns the redis:// URL of the server.
func (s *RedisServer) URL() string { return "redis://" + s.Addr() + "/0" }

// StartRedis starts a new redis-server with extra command-line args (for
// example "--requirepass", "x"); the caller stops it.
func StartRedis(args ...string) (*RedisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("no redis-server on PATH: install it (Debian: apt-get install redis-server) or set INGEST_TEST_REDIS_URL")
	}
	// A cluster node also listens on its port + 10000 (the cluster bus).
	// A free port is only free when it is asked for: another process may
	// take it (or its bus port) before the server binds it, so a server
	// that finds its address in use is started again on another port.
	cluster := slices.Contains(args, "--cluster-enabled")
	for attempt := 1; ; attempt++ {
		port, err := freeRedisPort(cluster)
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "ingest-redis-")
		if err != nil {
			return nil, err
		}
		s := &RedisServer{Port: port, Dir: dir, args: args}
		err = s.Start()
		if err == nil || attempt == 5 || !strings.Contains(err.Error(), "Address already in use") {
			return s, err
		}
		_ = os.RemoveAll(dir)
	}
}

// freeRedisPort returns a free port of 127.0.0.1; for a cluster node, one
// whose cluster bus port (+10000) is free too.
func freeRedisPort(cluster bool) (int, error) {
	for {
		port, err := freePort()
		if err != nil || !cluster {
			return port, err
		}
		if port+10000 > 65535 {
			continue
		}
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000)); err == nil {
			l.Close()
			return port, nil
		}
	}
}

// Start starts the server (again, empty) on its port.
func (s *RedisServer) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.Dir, "--logfile", s.Dir + "/redis.log"}, s.args...)
	cmd := exec.Command("redis-server", args...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.cmd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited: // it will not answer: say why at once
			log, _ := os.ReadFile(s.Dir + "/redis.log")
			return fmt.Errorf("redis-server on port %d exited; log:\n%s", s.Port, log)
		default:
		}
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err == nil || isAuthError(err) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	log, _ := os.ReadFile(s.Dir + "/redis.log")
	return fmt.Errorf("redis-server on port %d did not answer within 10s; log:\n%s", s.Port, log)
}

func isAuthError(err error) bool {
	msg := err.Error()
	return len(msg) >= 6 && (msg[:6] == "NOAUTH" || msg[:8] == "WRONGPAS")
}

// Kill stops the server at once (SIGKILL): everything it held is gone.
func (s *RedisServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		for i := 0; i < 500; i++ { // wait until the port is free again
			if err := s.cmd.Process.Signal(syscall.Signal(0)); err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Pause freezes the server with SIGSTOP; Resume continues it.
func (s *RedisServer) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server with SIGCONT.
func (s *RedisServer) Resume() { s.signal(syscall.SIGCONT) }

func (s *RedisServer) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Close kills the server and removes its directory.
func (s *RedisServer) Close() {
	s.Kill()
	_ = os.RemoveAll(s.Dir)
}

// NewRedisServer starts a redis-server owned by this test, for tests that
// flush, stop or freeze it. It is killed when the test ends.
func NewRedisServer(tb testing.TB, args ...string) *RedisServer {
	tb.Helper()
	s, err := StartRedis(args...)
	if err != nil {
		tb.Fatalf("test redis-server: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

var shared struct {
	once   sync.Once
	url    string
	server *RedisServer
	err    error
}

// RedisURL returns INGEST_TEST_REDIS_URL, or the URL of a redis-server
// started for this test process and shared by its tests. Tests sharing it
// must use their own keys (see Keys).
func RedisURL(tb testing.TB) string {
	tb.Helper()
	shared.once.Do(func() {
		if u := os.Getenv("INGEST_TEST_REDIS_URL"); u != "" {
			shared.url = u
			return
		}
		shared.server, shared.err = StartRedis()
		if shared.err == nil {
			shared.url = shared.server.URL()
			register(shared.server.Close)
		}
	})
	if shared.err != nil {
		tb.Fatalf("test redis-server: %v", shared.err)
	}
	return shared.url
}

// Redis returns a client of the shared real redis-server, closed on cleanup.
func Redis(tb testing.TB) *redis.Client {
	tb.Helper()
	return Client(tb, RedisURL(tb))
}

// Client returns a client for url, closed on cleanup.
func Client(tb testing.TB, url string) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("parse redis URL: %v", err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { c.Close() })
	return c
}

// Keys returns a task stream key and a DLQ key unique to this test, sharing
// one hash tag as on Redis Cluster.
func Keys(tb testing.TB) (stream, dlq string) {
	tag := "{t" + randomHex(6) + "}"
	return "ingest:" + tag + ":tasks", "ingest:" + tag + ":tasks:dlq"
}

// Backend is one Redis implementation a conformance suite runs against.
type Backend struct {
	Name   string
	URL    string
	Client *redis.Client
	// Mini is set for the miniredis backend (to fast-forward its clock).
	Mini *miniredis.Miniredis
}

// RedisBackends runs f as a subtest against miniredis and against the real
// test redis-server.
func RedisBackends(t *testing.T, f func(t *testing.T, b Backend)) {
	t.Helper()
	t.Run("Miniredis", func(t *testing.T) {
		m := miniredis.RunT(t)
		url := "redis://" + m.Addr() + "/0"
		f(t, Backend{Name: "miniredis", URL: url, Client: Client(t, url), Mini: m})
	})
	t.Run("Redis", func(t *testing.T) {
		url := RedisURL(t)
		f(t, Backend{Name: "redis", URL: url, Client: Client(t, url)})
	})
}
