package pgtemp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// childEnv makes the test binary, run as a child process by child, do what
// it says instead of running the tests.
const childEnv = "PGTEMP_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "orphan":
		// Start a cluster and exit without closing it, as a test binary
		// killed by its timeout does.
		s, err := Start()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(s.Dir)
		os.Exit(0)
	case "exit":
		os.Exit(0)
	case "wait":
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child runs the test binary as a child process doing what (see TestMain)
// and returns its PID and its output.
func child(t *testing.T, what string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+what)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", what, err, stderr.Bytes())
	}
	return cmd.Process.Pid, strings.TrimSpace(string(out))
}

// waitingChild starts the test binary as a child process that works in dir
// and waits until the test ends, and returns its PID.
func waitingChild(t *testing.T, dir string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=wait")
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Error(err)
		}
	})
	return cmd.Process.Pid
}

// privateTemp points os.TempDir() (and the children's) at a directory of
// the test's own, so that the reaper sees the test's clusters only, and
// those of other processes on the machine are left alone.
func privateTemp(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// When the tests run as root, the servers run as nobody, who must
	// reach their directories.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("TMPDIR", dir)
	return dir
}

// await fails the test when cond does not hold within 10 s.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// gone reports whether process pid has exited.
func gone(pid int) bool {
	state, _, err := procStat(pid)
	return errors.Is(err, fs.ErrNotExist) || err == nil && state == "Z"
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestReapOrphans reaps cluster directories without servers: those of dead
// owners, and old ones without an owner and without a running server.
func TestReapOrphans(t *testing.T) {
	if !haveProc() {
		t.Skip("no /proc")
	}
	tmp := privateTemp(t)
	me := self()
	if me.start == "-" || me.pidns == "-" {
		t.Fatalf("own start time or PID namespace unknown: %+v", me)
	}
	deadPID, _ := child(t, "exit")
	cases := []struct {
		name   string
		owner  string // the owner file; none when empty
		server string // the PID in data/postmaster.pid: "dead", "live" (a process working in data/), "self"; none when empty
		old    bool   // older than unownedAge
		reaped bool
	}{
		{name: "dead owner", owner: fmt.Sprintf("%d 1 %s\n", deadPID, me.pidns), reaped: true},
		{name: "dead owner, old, stale postmaster.pid", owner: fmt.Sprintf("%d 1 %s\n", deadPID, me.pidns), server: "dead", old: true, reaped: true},
		{name: "owner's PID reused", owner: fmt.Sprintf("%d %s0 %s\n", me.pid, me.start, me.pidns), reaped: true},
		{name: "live owner", owner: me.line(), old: true},
		{name: "live owner, start time unknown", owner: fmt.Sprintf("%d - %s\n", me.pid, me.pidns), old: true},
		{name: "dead owner in another PID namespace", owner: fmt.Sprintf("%d 1 pid:[1]\n", deadPID), old: true},
		{name: "malformed owner file", owner: strconv.Itoa(deadPID), old: true},
		{name: "no owner, young", server: "dead"},
		{name: "no owner, old", old: true, reaped: true},
		{name: "no owner, old, server dead", server: "dead", old: true, reaped: true},
		{name: "no owner, old, server's PID reused", server: "self", old: true, reaped: true},
		{name: "no owner, old, server running", server: "live", old: true},
	}
	dirs := make([]string, len(cases))
	want := 0
	for i, c := range cases {
		dir, err := os.MkdirTemp(tmp, dirPrefix)
		if err != nil {
			t.Fatal(err)
		}
		dirs[i] = dir
		data := filepath.Join(dir, "data")
		if err := os.Mkdir(data, 0o700); err != nil {
			t.Fatal(err)
		}
		if c.owner != "" {
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(c.owner), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if c.server != "" {
			pid := map[string]int{"dead": deadPID, "self": me.pid}[c.server]
			if c.server == "live" {
				pid = waitingChild(t, data)
			}
			if err := os.WriteFile(filepath.Join(data, "postmaster.pid"), []byte(fmt.Sprintf("%d\n%s\n", pid, data)), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if c.old {
			then := time.Now().Add(-2 * unownedAge)
			if err := os.Chtimes(dir, then, then); err != nil {
				t.Fatal(err)
			}
		}
		if c.reaped {
			want++
		}
	}
	other := filepath.Join(tmp, "ingest-other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}

	n, err := ReapOrphans()
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Errorf("ReapOrphans reaped %d directories, want %d", n, want)
	}
	for i, c := range cases {
		if there := exists(dirs[i]); there == c.reaped {
			t.Errorf("%s: directory there %v, want %v", c.name, there, !c.reaped)
		}
	}
	if !exists(other) {
		t.Errorf("%s, not a cluster directory, was removed", other)
	}
	if n, err := ReapOrphans(); n != 0 || err != nil {
		t.Errorf("ReapOrphans again = %d, %v; want 0, nil", n, err)
	}
}

// TestReapOrphanedServer has a child process start a cluster and exit
// without closing it; the next StartWith stops the orphaned server and
// removes its directory, and leaves the clusters of live owners alone.
func TestReapOrphanedServer(t *testing.T) {
	bin, err := BinDir()
	if err != nil {
		t.Skip(err)
	}
	privateTemp(t)
	start := func() *Server {
		t.Helper()
		s, err := Start()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
		return s
	}
	live := start()

	pid, dir := child(t, "orphan")
	t.Cleanup(func() {
		// Should the test fail before the orphan is reaped.
		if exists(dir) {
			_ = stopOrphan(bin, dir)
			_ = os.RemoveAll(dir)
		}
	})
	if o, err := readOwner(dir); err != nil || o.pid != pid {
		t.Fatalf("owner of the child's cluster: %+v, %v; want PID %d", o, err, pid)
	}
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	postmaster, err := strconv.Atoi(line)
	if err != nil {
		t.Fatal(err)
	}
	if running, err := postmasterRunning(filepath.Join(dir, "data")); !running || err != nil {
		t.Fatalf("the orphaned server is not running (%v)", err)
	}

	second := start()
	if exists(dir) {
		t.Errorf("StartWith left the orphaned cluster's directory %s", dir)
	}
	await(t, "the orphaned server's postmaster exits", func() bool { return gone(postmaster) })
	for _, s := range []*Server{live, second} {
		if running, err := postmasterRunning(filepath.Join(s.Dir, "data")); !running || err != nil {
			t.Errorf("the server of %s is not running (%v)", s.Dir, err)
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)), 5*time.Second)
		if err != nil {
			t.Errorf("the server of %s: %v", s.Dir, err)
			continue
		}
		c.Close()
	}
	if n, err := ReapOrphans(); n != 0 || err != nil {
		t.Errorf("ReapOrphans after StartWith = %d, %v; want 0, nil", n, err)
	}
}
