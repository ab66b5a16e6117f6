package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// binaries holds the commands Binary built in this test process, by import
// path.
var binaries struct {
	mu    sync.Mutex
	built map[string]*binary
}

type binary struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of the command with import path pkg, built by the
// first test of the process that asks for it (go build, without -race) and
// shared by the others: tests run it and never change it. The directory
// goes when Main returns.
func Binary(tb testing.TB, pkg string) string {
	tb.Helper()
	binaries.mu.Lock()
	if binaries.built == nil {
		binaries.built = map[string]*binary{}
	}
	b := binaries.built[pkg]
	if b == nil {
		b = &binary{}
		binaries.built[pkg] = b
	}
	binaries.mu.Unlock()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "testenv-bin-")
		if err != nil {
			b.err = err
			return
		}
		register(func() { os.RemoveAll(dir) })
		p := filepath.Join(dir, filepath.Base(pkg))
		if out, err := exec.Command("go", "build", "-o", p, pkg).CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
			return
		}
		b.path = p
	})
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.path
}
