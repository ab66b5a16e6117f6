package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/migrations"
)

// PostgresServer is a throwaway PostgreSQL cluster started from the local
// binaries (initdb, pg_ctl), run as an unprivileged user when the tests run
// as root.
type PostgresServer struct {
	Dir  string // cluster root: data/, the socket and the log
	Port int
	bin  string
	cred *syscall.Credential
}

// URL returns the URL of database name on the server.
func (s *PostgresServer) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, name)
}

// Restart restarts the server in fast mode (open connections are dropped).
func (s *PostgresServer) Restart() error {
	return s.pgctl("-m", "fast", "-w", "restart")
}

// Stop stops the server immediately.
func (s *PostgresServer) Stop() error {
	return s.pgctl("-m", "immediate", "-w", "stop")
}

func (s *PostgresServer) pgctl(args ...string) error {
	all := append([]string{"-D", filepath.Join(s.Dir, "data"), "-l", filepath.Join(s.Dir, "log")}, args...)
	if args[len(args)-1] != "stop" {
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400 -c shared_buffers=32MB", s.Port, s.Dir)
		all = append(all, "-o", opts)
	}
	return s.run("pg_ctl", all...)
}

func (s *PostgresServer) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// StartPostgres starts a new throwaway cluster; the caller stops it.
func StartPostgres() (*PostgresServer, error) {
	bin, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ingest-pg-")
	if err != nil {
		return nil, err
	}
	s := &PostgresServer{Dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: run it as nobody.
		u, err := user.Lookup("nobody")
		if err != nil {
			return nil, fmt.Errorf("tests run as root and PostgreSQL refuses root, but there is no user 'nobody' to run it as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if err := s.run("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return nil, err
	}
	if s.Port, err = freePort(); err != nil {
		return nil, err
	}
	if err := s.pgctl("-w", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		return nil, fmt.Errorf("%w\nserver log:\n%s", err, log)
	}
	return s, nil
}

// postgresBinDir finds initdb and pg_ctl on PATH or under
// /usr/lib/postgresql/*/bin (Debian), newest version first.
func postgresBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin: " +
		"install them (Debian: apt-get install postgresql) or set INGEST_TEST_DATABASE_URL to a server the tests may create databases on")
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Database is a fresh, migrated database used by one test only.
type Database struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

var pg struct {
	once   sync.Once
	admin  string // URL of a database on the server to issue CREATE DATABASE from
	server *PostgresServer
	err    error
}

// adminURL returns INGEST_TEST_DATABASE_URL, or the URL of a throwaway
// server started for this test process.
func adminURL(tb testing.TB) string {
	tb.Helper()
	pg.once.Do(func() {
		if u := os.Getenv("INGEST_TEST_DATABASE_URL"); u != "" {
			pg.admin = u
			return
		}
		pg.server, pg.err = StartPostgres()
		if pg.err == nil {
			pg.admin = pg.server.URL("postgres")
			register(func() { _ = pg.server.Stop(); _ = os.RemoveAll(pg.server.Dir) })
		}
	})
	if pg.err != nil {
		tb.Fatalf("test PostgreSQL: %v", pg.err)
	}
	return pg.admin
}

// NewDatabase creates a database for this test, cloned from a template that
// has every migration applied, and drops it when the test ends.
func NewDatabase(tb testing.TB) *Database {
	tb.Helper()
	admin := adminURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	tmpl, err := ensureTemplate(ctx, conn, admin)
	if err != nil {
		tb.Fatalf("test database template: %v", err)
	}
	name := "ingest_test_" + randomHex(6)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl)); err != nil {
		tb.Fatalf("create test database: %v", err)
	}
	url, err := withDatabase(admin, name)
	if err != nil {
		tb.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url+"&pool_max_conns=32")
	if err != nil {
		tb.Fatalf("connect to %s: %v", name, err)
	}
	tb.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		_, _ = c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
	})
	return &Database{Name: name, URL: url, Pool: pool}
}

// DB is NewDatabase(tb).Pool.
func DB(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return NewDatabase(tb).Pool
}

// ensureTemplate creates (once per server and schema) a migrated template
// database, serialised across test processes by an advisory lock.
func ensureTemplate(ctx context.Context, conn *pgx.Conn, admin string) (string, error) {
	name := "ingest_tmpl_" + schemaHash()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtext('ingest-worker test template'))`); err != nil {
		return "", err
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext('ingest-worker test template'))`) //nolint:errcheck
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_build"
	if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", building)); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", building)); err != nil {
		return "", err
	}
	url, err := withDatabase(admin, building)
	if err != nil {
		return "", err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return "", err
	}
	_, err = migrations.Up(ctx, pool)
	pool.Close()
	if err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name)); err != nil {
		return "", err
	}
	return name, nil
}

func schemaHash() string {
	h := sha256.New()
	files, _ := fs.Glob(migrations.Files(), "*.sql")
	sort.Strings(files)
	for _, f := range files {
		b, _ := fs.ReadFile(migrations.Files(), f)
		h.Write([]byte(f))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// withDatabase returns url with its database replaced by name.
func withDatabase(url, name string) (string, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "", fmt.Errorf("parse test database URL: %w", err)
	}
	u := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	if cfg.Password != "" {
		u = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, name)
	}
	return u, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
