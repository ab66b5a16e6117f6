package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is a pgbouncer process in transaction pooling mode in front of
// the test PostgreSQL server (Debian's package pgbouncer), owned by one
// test and stopped when it ends.
type PgBouncer struct {
	Port int
	Dir  string

	cmd    *exec.Cmd
	mu     sync.Mutex
	output bytes.Buffer
}

// pgbouncerBinary finds pgbouncer on PATH or in /usr/sbin (Debian installs
// it there, outside an ordinary user's PATH).
func pgbouncerBinary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("no pgbouncer binary on PATH or in /usr/sbin: install it (Debian/Ubuntu: apt-get install pgbouncer; Fedora: dnf install pgbouncer; macOS: brew install pgbouncer)")
}

// NewPgBouncer starts pgbouncer on a free port of 127.0.0.1, pooling
// transactions (pool_mode = transaction) for every database of the test
// PostgreSQL server, with trust authentication and an admin console
// (database pgbouncer) for the server's user. A missing pgbouncer binary
// fails the test.
func NewPgBouncer(tb testing.TB) *PgBouncer {
	tb.Helper()
	bin, err := pgbouncerBinary()
	if err != nil {
		tb.Fatalf("test PgBouncer: %v", err)
	}
	server, err := pgx.ParseConfig(adminURL(tb))
	if err != nil {
		tb.Fatalf("test PgBouncer: parse the test PostgreSQL URL: %v", err)
	}
	dir, err := os.MkdirTemp("", "ingest-pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	b := &PgBouncer{Port: port, Dir: dir}
	target := fmt.Sprintf("host=%s port=%d user=%s", server.Host, server.Port, server.User)
	if server.Password != "" {
		target += " password=" + server.Password
	}
	ini := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 40
ignore_startup_parameters = extra_float_digits
server_check_delay = 0
`, target, port, filepath.Join(dir, "users.txt"), server.User)
	users := fmt.Sprintf("%q \"\"\n", server.User)
	for name, content := range map[string]string{"pgbouncer.ini": ini, "users.txt": users} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &lockedWriter{b}, &lockedWriter{b}
	if os.Geteuid() == 0 {
		// pgbouncer refuses to run as root, like PostgreSQL.
		u, err := user.Lookup("nobody")
		if err != nil {
			tb.Fatalf("test PgBouncer: running as root and pgbouncer refuses root, but there is no user 'nobody' to run it as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("test PgBouncer: start %s: %v", bin, err)
	}
	b.cmd = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			tb.Fatalf("test PgBouncer exited at start (%v):\n%s", err, b.Output())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("test PgBouncer: not listening on port %d after 15s:\n%s", port, b.Output())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return b
}

// lockedWriter appends pgbouncer's output to its buffer.
type lockedWriter struct{ b *PgBouncer }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	return w.b.output.Write(p)
}

// Output is what pgbouncer has logged so far.
func (b *PgBouncer) Output() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.output.String()
}

// URL returns dbURL (a test database's URL, see Database.URL) with its
// host and port replaced by the bouncer's: the same database, through
// PgBouncer.
func (b *PgBouncer) URL(tb testing.TB, dbURL string) string {
	tb.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		tb.Fatalf("test PgBouncer: parse %q: %v", dbURL, err)
	}
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", cfg.User, b.Port, cfg.Database)
}

// BouncerClient is one client connection of the bouncer (SHOW CLIENTS).
type BouncerClient struct {
	Database        string
	ApplicationName string
	State           string
}

// Clients lists the bouncer's client connections (SHOW CLIENTS on its
// admin console), without the admin connection itself.
func (b *PgBouncer) Clients(tb testing.TB) []BouncerClient {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	server, err := pgx.ParseConfig(adminURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s@127.0.0.1:%d/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol", server.User, b.Port))
	if err != nil {
		tb.Fatalf("test PgBouncer: connect to the admin console: %v\n%s", err, b.Output())
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SHOW CLIENTS")
	if err != nil {
		tb.Fatalf("test PgBouncer: SHOW CLIENTS: %v", err)
	}
	defer rows.Close()
	var out []BouncerClient
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			tb.Fatalf("test PgBouncer: SHOW CLIENTS: %v", err)
		}
		col := map[string]string{}
		for i, fd := range rows.FieldDescriptions() {
			if vals[i] != nil {
				col[fd.Name] = fmt.Sprint(vals[i])
			}
		}
		if col["database"] == "pgbouncer" {
			continue
		}
		out = append(out, BouncerClient{Database: col["database"], ApplicationName: col["application_name"], State: col["state"]})
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("test PgBouncer: SHOW CLIENTS: %v", err)
	}
	return out
}

// ClientsNamed counts the bouncer's clients whose application_name starts
// with prefix.
func (b *PgBouncer) ClientsNamed(tb testing.TB, prefix string) int {
	tb.Helper()
	n := 0
	for _, c := range b.Clients(tb) {
		if strings.HasPrefix(c.ApplicationName, prefix) {
			n++
		}
	}
	return n
}
