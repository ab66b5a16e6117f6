package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/internal/testenv"
)

// buildBinary returns the command's binary, built once per test process.
func buildBinary(t *testing.T) string {
	t.Helper()
	return testenv.Binary(t, "github.com/ingest-worker/ingest/cmd/ingest-worker")
}

// childEnv is the environment of a child process: ours without INGEST_*
// and PG* variables, plus env ("K=V").
func childEnv(env ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "INGEST_") || strings.HasPrefix(kv, "PG") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, env...)
}

// proc is a running child process.
type proc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr *testenv.Buffer
	done           chan struct{}
	code           int
}

// start starts bin with args and env; it is killed when the test ends if
// still running.
func start(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = childEnv(env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
		default:
			p.code = -1
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
			t.Logf("%s killed at the end of the test; stderr:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// wait waits up to timeout for the process to exit and returns its exit
// code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("%v did not exit within %s; stderr:\n%s", p.cmd.Args, timeout, p.stderr.String())
		return -1
	}
}

// mustBeRunning fails the test if the process has exited.
func (p *proc) mustBeRunning() {
	p.t.Helper()
	select {
	case <-p.done:
		p.t.Fatalf("%v exited with %d:\n%s", p.cmd.Args, p.code, p.stderr.String())
	default:
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// result is a finished command.
type result struct {
	code           int
	stdout, stderr string
}

// runBin runs bin to completion (within a minute) with stdin.
func runBin(t *testing.T, bin string, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = childEnv(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run %v: %v", args, err)
	}
	return result{code, stdout.String(), stderr.String()}
}

// mustRun runs bin and fails the test unless it exits 0.
func mustRun(t *testing.T, bin string, env []string, stdin string, args ...string) string {
	t.Helper()
	r := runBin(t, bin, env, stdin, args...)
	if r.code != 0 {
		t.Fatalf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// freeAddr returns a 127.0.0.1 address that was free a moment ago, for
// the binary under test to listen on (pgtemp.FreePort: outside the range
// the ports of outgoing connections are taken from).
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := pgtemp.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// waitReady waits until the HTTP server at addr answers /readyz with 200.
func waitReady(t *testing.T, p *proc, addr string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the worker to be ready", func() bool {
		p.mustBeRunning()
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}
