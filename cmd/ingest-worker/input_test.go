package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/internal/termsafe"
)

// runCLI runs the command line in this process and returns its exit code,
// stdout and stderr.
func runCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := execute(context.Background(), args, strings.NewReader(""), &stdout, &stderr, envOf(env))
	return code, stdout.String(), stderr.String()
}

// screenSafe reports whether text holds no character a terminal would act
// on but its new lines.
func screenSafe(text string) bool { return termsafe.Safe(strings.ReplaceAll(text, "\n", "")) }

// TestFlagsAreRangeChecked: a numeric flag out of its range (or no whole
// number) is a usage error (exit 2) naming the flag and the range, found
// before anything is done; enqueue --max-attempts 3000000000 printed a raw
// SQL error. A name with a control character is refused naming its flag.
func TestFlagsAreRangeChecked(t *testing.T) {
	t.Parallel()
	env := map[string]string{"INGEST_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--max-attempts", "3000000000"}, []string{"--max-attempts", "from 1 to 1000000"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--max-attempts", "0"}, []string{"--max-attempts", "from 1 to 1000000"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--max-attempts", "99999999999999999999"}, []string{"--max-attempts", "from 1 to 1000000"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--delay", "1000000h"}, []string{"--delay", "delay_ms", "from 0 to"}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--timeout", "600h"}, []string{"--timeout", "timeout_ms", "from 0 to 2147483647"}},
		{[]string{"enqueue", "--kind", "esc\x1b[2J", "--payload", "{}"}, []string{"--kind", `\x1b`}},
		{[]string{"enqueue", "--kind", "k", "--payload", "{}", "--idempotency-key", "a\u202eb"}, []string{"--idempotency-key", `\u202e`}},
		{[]string{"task", "list", "--limit", "1001"}, []string{"--limit", "from 1 to 1000"}},
		{[]string{"task", "list", "--limit", "1e3"}, []string{"--limit", "from 1 to 1000"}},
		{[]string{"task", "redrive", "--status", "DEAD", "--limit", "1000001"}, []string{"--limit", "from 1 to 1000000"}},
		{[]string{"task", "redrive", "--status", "DEAD", "--rate", "NaN"}, []string{"--rate", "0.01"}},
		{[]string{"task", "redrive", "--status", "DEAD", "--rate", "1e-300"}, []string{"--rate", "0.01"}},
		{[]string{"kind", "set", "k", "--concurrency", "4294967297"}, []string{"--concurrency", "from 0 to 100000"}},
		{[]string{"dlq", "list", "--limit", "0"}, []string{"--limit", "from 1 to"}},
		{[]string{"pending", "--oldest", "-1"}, []string{"--oldest", "from 0 to 1000"}},
		{[]string{"healthcheck", "--timeout", "-1s"}, []string{"--timeout", "> 0"}},
		{[]string{"run", "--worker-concurrency", "1000000000000"}, []string{"INGEST_WORKER_CONCURRENCY", "--worker-concurrency", "from 1 to 100000"}},
	} {
		code, stdout, stderr := runCLI(t, env, tc.args...)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d\nstdout: %s\nstderr: %s", tc.args, code, exitUsage, stdout, stderr)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: stderr %q does not name %q", tc.args, stderr, w)
			}
		}
		if !screenSafe(stderr) {
			t.Errorf("%q: stderr %q holds characters a terminal acts on", tc.args, stderr)
		}
	}
}
