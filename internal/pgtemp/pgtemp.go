// Package pgtemp starts throwaway PostgreSQL clusters from the local server
// binaries (initdb, pg_ctl) for tests and for `ingest-worker demo`.
//
// A cluster lives in a temporary directory, listens on 127.0.0.1 on a free
// port with trust authentication for the user postgres, and is tuned for
// speed, not durability (fsync off), unless started with Options.Durable
// (fsync, synchronous_commit and full_page_writes on, as in production:
// for honest benchmarks). When the process runs as root, the cluster runs
// as the user nobody, because PostgreSQL refuses to run as root.
//
// A cluster's directory records its owner, the process that started it
// (PID, start time and PID namespace, in the file owner). A process that
// dies without Close (a test binary killed by go test's -timeout, a panic,
// os.Exit, SIGKILL) would leave its server running for ever: StartWith
// first reaps such orphans, stopping their servers and removing their
// directories, and ReapOrphans does the same on demand. A directory whose
// owner is alive is never touched.
package pgtemp

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
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
	"time"
)

// ErrNoBinaries is returned by Start when initdb and pg_ctl cannot be found.
var ErrNoBinaries = errors.New("no PostgreSQL server binaries (initdb, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin: " +
	"install them (Debian/Ubuntu: apt-get install postgresql; Fedora: dnf install postgresql-server; macOS: brew install postgresql)")

// Server is a throwaway PostgreSQL cluster.
type Server struct {
	Dir  string // cluster root: data/, the socket, the log and the owner file
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
// stops it (Close). It first reaps the orphaned clusters of processes that
// died without closing theirs (see ReapOrphans); failing to is no error.
func StartWith(opts Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	_, _ = reapOrphans(bin)
	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, bin: bin, opts: opts}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := writeOwner(dir); err != nil {
		return fail(err)
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

// dirPrefix begins the name of every cluster directory in os.TempDir().
const dirPrefix = "ingest-pg-"

// ownerFile, in a cluster directory, records the process that started the
// cluster: one line of its PID, its start time (field 22 of
// /proc/<pid>/stat, clock ticks after boot; "-" where unknown) and its PID
// namespace (the link /proc/self/ns/pid; "-" where unknown), separated by
// spaces.
const ownerFile = "owner"

// unownedAge is the age after which a cluster directory without an owner
// file (from before owners were recorded, or one whose creator died before
// recording itself) is reaped, provided no server runs in it. A younger one
// may be one whose creator has not recorded itself yet.
const unownedAge = time.Hour

type owner struct {
	pid   int
	start string // "-" where unknown
	pidns string // "-" where unknown
}

// line is o as the owner file holds it.
func (o owner) line() string { return fmt.Sprintf("%d %s %s\n", o.pid, o.start, o.pidns) }

// self is this process as an owner.
var self = sync.OnceValue(func() owner {
	o := owner{pid: os.Getpid(), start: "-", pidns: "-"}
	if _, start, err := procStat(o.pid); err == nil {
		o.start = start
	}
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil && !strings.ContainsAny(ns, " \n") {
		o.pidns = ns
	}
	return o
})

// writeOwner records this process as the owner of cluster directory dir.
// The file appears whole (renamed into place), so a reaper never reads half
// of it.
func writeOwner(dir string) error {
	tmp := filepath.Join(dir, ownerFile+".tmp")
	if err := os.WriteFile(tmp, []byte(self().line()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, ownerFile))
}

var errBadOwner = errors.New("malformed owner file")

func readOwner(dir string) (owner, error) {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return owner{}, err
	}
	f := strings.Fields(string(b))
	if len(f) != 3 || !bytes.HasSuffix(b, []byte("\n")) {
		return owner{}, errBadOwner
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return owner{}, errBadOwner
	}
	return owner{pid: pid, start: f[1], pidns: f[2]}, nil
}

// alive reports whether o still runs, as far as can be told: false only
// when it surely does not (no such process, a zombie, or a process that got
// the PID later, with another start time).
func (o owner) alive() bool {
	state, start, err := procStat(o.pid)
	if err == nil {
		return state != "Z" && (o.start == "-" || start == o.start)
	}
	if errors.Is(err, fs.ErrNotExist) && haveProc() {
		return false
	}
	return pidTaken(o.pid)
}

// procStat returns the state (field 3) and the start time (field 22) of
// process pid from /proc/<pid>/stat.
func procStat(pid int) (state, start string, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", "", err
	}
	// Field 2, the command name, is in parentheses and may hold spaces and
	// parentheses itself: field 3 follows its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", "", fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	return f[0], f[19], nil
}

// haveProc reports whether /proc describes processes (Linux).
func haveProc() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// pidTaken reports whether a process has PID pid, where /proc cannot tell
// more; a PID that cannot be signalled for want of permission is taken.
func pidTaken(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// postmasterRunning reports whether the server of data directory data runs:
// whether the process its postmaster.pid names is alive and, where /proc
// tells, works in data (the postmaster's working directory), not a process
// that got the PID after the server died. An error means it cannot tell.
func postmasterRunning(data string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return false, fmt.Errorf("%s: no PID in postmaster.pid", data)
	}
	state, _, err := procStat(pid)
	if err == nil {
		if state == "Z" {
			return false, nil
		}
		cwd, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
		if err != nil {
			return true, nil // cannot tell: assume it is the server
		}
		if cwd == data {
			return true, nil
		}
		real, err := filepath.EvalSymlinks(data)
		return err == nil && cwd == real, nil
	}
	if errors.Is(err, fs.ErrNotExist) && haveProc() {
		return false, nil
	}
	return pidTaken(pid), nil
}

// reaping serialises the reapers of this process.
var reaping sync.Mutex

// ReapOrphans reaps orphaned clusters, as StartWith does first: it stops
// the server (pg_ctl -m immediate stop, as the user the server runs as) and
// removes the directory of every cluster in os.TempDir() whose owner has
// died (no process has its PID, or one with another start time has), and
// of every directory without an owner file that is older than an hour and
// has no server running. A directory whose owner is alive, or one whose
// owner is in another PID namespace, is never touched.
//
// It returns how many directories it removed, and the orphans it failed to
// stop or remove (they are tried again on the next call).
func ReapOrphans() (int, error) {
	bin, _ := BinDir() // without pg_ctl, orphans without a server are still removed
	return reapOrphans(bin)
}

func reapOrphans(bin string) (int, error) {
	reaping.Lock()
	defer reaping.Unlock()
	tmp := os.TempDir()
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		if !orphaned(dir) {
			continue
		}
		if err := reap(bin, dir); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// orphaned reports whether cluster directory dir is to be reaped.
func orphaned(dir string) bool {
	o, err := readOwner(dir)
	if err == nil {
		return o.pidns == self().pidns && !o.alive()
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return false // unreadable or malformed: not ours to judge
	}
	fi, err := os.Stat(dir)
	if err != nil || time.Since(fi.ModTime()) < unownedAge {
		return false
	}
	running, err := postmasterRunning(filepath.Join(dir, "data"))
	return err == nil && !running
}

// reap stops the server of orphaned cluster directory dir, if it runs, and
// removes the directory. A server that cannot be stopped keeps its
// directory (removing it would lose the server for good).
func reap(bin, dir string) error {
	data := filepath.Join(dir, "data")
	running, err := postmasterRunning(data)
	if err != nil {
		return fmt.Errorf("orphaned cluster %s: %w", dir, err)
	}
	if running {
		if bin == "" {
			return fmt.Errorf("orphaned cluster %s: cannot stop its server: %w", dir, ErrNoBinaries)
		}
		stopErr := stopOrphan(bin, dir)
		if running, err = postmasterRunning(data); err == nil && running {
			err = errors.New("server still running")
		}
		if err != nil {
			return fmt.Errorf("orphaned cluster %s: %w", dir, errors.Join(err, stopErr))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("orphaned cluster %s: %w", dir, err)
	}
	return nil
}

// stopOrphan stops the server of cluster directory dir immediately, run as
// the owner of its data directory when this process is root (as
// StartWith's servers are).
func stopOrphan(bin, dir string) error {
	s := &Server{Dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		fi, err := os.Stat(filepath.Join(dir, "data"))
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			s.cred = &syscall.Credential{Uid: st.Uid, Gid: st.Gid}
		}
	}
	return s.Stop()
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
