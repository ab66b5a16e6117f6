package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Root is the repository's root directory (the one holding go.mod), found
// from the test's working directory.
func Root(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "tools", "node", "package.json")); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("testenv: no repository root (go.mod beside tools/node) above the working directory")
		}
		dir = parent
	}
}

// NodeBin is the path of an executable the repository's Node.js test tools
// provide (tools/node/package.json: the pg driver, the OpenAPI linter,
// validation proxy and client generator, tsx). A missing tool fails the
// test with the command that installs them: ./test.sh does it on its own.
func NodeBin(tb testing.TB, name string) string {
	tb.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		tb.Fatalf("testenv: no node on PATH: run ./test.sh, or install Node.js (Debian: apt-get install nodejs npm)")
	}
	p := filepath.Join(Root(tb), "tools", "node", "node_modules", ".bin", name)
	if _, err := os.Stat(p); err != nil {
		tb.Fatalf("testenv: %s is not installed: run ./test.sh, or npm ci --prefix tools/node", name)
	}
	return p
}

// NodeModules is tools/node/node_modules, for NODE_PATH when a test runs a
// Node.js script that requires one of the tools' packages (pg).
func NodeModules(tb testing.TB) string {
	tb.Helper()
	NodeBin(tb, "tsx")
	return filepath.Join(Root(tb), "tools", "node", "node_modules")
}

// Python3 is Debian's Python (/usr/bin/python3) when it can import psycopg
// (Debian package python3-psycopg); a pyenv python3 earlier on PATH lacks
// Debian's packages. A missing module fails the test with the install line.
func Python3(tb testing.TB) string {
	tb.Helper()
	const py = "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import psycopg").CombinedOutput(); err != nil {
		tb.Fatalf("testenv: %s cannot import psycopg (%v: %s): run ./test.sh, or apt-get install python3-psycopg", py, err, out)
	}
	return py
}
