// Package pgtemp starts throwaway PostgreSQL clusters from the local server
// binaries (initdb, pg_ctl) for tests and for `ingest-worker demo`.
//
// A cluster lives in a temporary directory, listens on 127.0.0.1 on a free
// port with trust authentication for the user postgres, and is tuned for
// speed, not durability (fsync off), unless started with Options.Durable
// (fsync, synchronous_commit and full_page_writes on, as in production:
// for honest benchmarks). When the process runs as root, the cluster runs
// as the user nobody, because PostgreSQL refuses to run as root.
package pgtemp

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// ErrNoBinaries is returned by Start when initdb and pg_ctl cannot be found.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin: " +
	"install them (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; macOS: brew install postgresql)")

// Server is a throwaway PostgreSQL cluster.
type Server struct {
	Dir  string // cluster root: data/, the socket and the log
	Port int
	opts Options
	bin  string
	cred *syscall.Credential
}

// Options configures a cluster started by StartWith.
type Options struct {
	// Durable runs with fsync, synchronous_commit and full_page_writes on
	// (PostgreSQL's defaults); otherwise all three are off.
	Durable bool
	// SharedBuffers is shared_buffers (default "32MB"; "128MB" when
	// Durable).
	SharedBuffers string
	// Settings are extra -c name=value server settings.
	Settings []string
}

// URL returns the URL of database name on the server.
func (s *Server) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, name)
}

// LogFile returns the path of the server log.
func (s *Server) LogFile() string { return filepath.Join(s.Dir, "log") }

// Restart restarts the server in fast mode (open connections are dropped).
func (s *Server) Restart() error {
	return s.pgctl("-m", "fast", "-w", "restart")
}

// Stop stops the server immediately.
func (s *Server) Stop() error {
	return s.pgctl("-m", "immediate", "-w", "stop")
}

// Close stops the server and removes its directory.
func (s *Server) Close() error {
	err := s.Stop()
	if rmErr := os.RemoveAll(s.Dir); err == nil {
		err = rmErr
	}
	return err
}

func (s *Server) pgctl(args ...string) error {
	all := append([]string{"-D", filepath.Join(s.Dir, "data"), "-l", s.LogFile()}, args...)
	if args[len(args)-1] != "stop" {
		durability := "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
		buffers := "32MB"
		if s.opts.Durable {
			durability = "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
			buffers = "128MB"
		}
		if s.opts.SharedBuffers != "" {
			buffers = s.opts.SharedBuffers
		}
		opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 %s -c max_connections=400 -c shared_buffers=%s", s.Port, s.Dir, durability, buffers)
		for _, kv := range s.opts.Settings {
			opts += " -c " + kv
		}
		all = append(all, "-o", opts)
	}
	return s.run("pg_ctl", all...)
}

func (s *Server) run(name string, args ...string) error {
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

// Start initialises and starts a new cluster tuned for speed (fsync off);
// the caller stops it (Close).
func Start() (*Server, error) { return StartWith(Options{}) }

// StartWith initialises and starts a new cluster with opts; the caller
// stops it (Close).
func StartWith(opts Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ingest-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, bin: bin, opts: opts}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: run it as nobody.
		u, err := user.Lookup("nobody")
		if err != nil {
			return fail(fmt.Errorf("running as root and PostgreSQL refuses root, but there is no user 'nobody' to run it as: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	if err := s.run("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return fail(err)
	}
	if s.Port, err = FreePort(); err != nil {
		return fail(err)
	}
	if err := s.pgctl("-w", "start"); err != nil {
		log, _ := os.ReadFile(s.LogFile())
		return fail(fmt.Errorf("%w\nserver log:\n%s", err, log))
	}
	return s, nil
}

// BinDir finds initdb and pg_ctl on PATH or under /usr/lib/postgresql/*/bin
// (Debian), newest version first. It returns ErrNoBinaries when there are
// none.
func BinDir() (string, error) {
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
	return "", ErrNoBinaries
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// for a server another process is about to start on it. It is chosen below
// the kernel's ephemeral range (net.ipv4.ip_local_port_range), where the
// port of an outgoing connection (many are opened by tests running in
// parallel) never lands: a port from that range, as "127.0.0.1:0" gives,
// can be taken by one between the check and the server's bind. Where the
// range cannot be read, or leaves no room below it, the kernel's choice is
// used.
func FreePort() (int, error) {
	if lo := ephemeralLow(); lo > freePortMin+1000 {
		for range 50 {
			port := freePortMin + rand.IntN(lo-freePortMin)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePortMin is the lowest port FreePort picks (above the usual ports of
// local services).
const freePortMin = 20000

// ephemeralLow returns the first port of the kernel's ephemeral range, or
// 0 when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}
