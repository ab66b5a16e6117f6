package sqlenqueue_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestPythonClient runs testdata/enqueue.py (Debian's python3-psycopg)
// against a running worker.
func TestPythonClient(t *testing.T) {
	t.Parallel()
	py := testenv.Python3(t)
	testClient(t, "py-invoice", func(dbURL string) *exec.Cmd {
		cmd := exec.Command(py, "testdata/enqueue.py")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		return cmd
	})
}

// TestNodeClient runs testdata/enqueue.js (npm's pg, tools/node) against a
// running worker.
func TestNodeClient(t *testing.T) {
	t.Parallel()
	modules := testenv.NodeModules(t)
	testClient(t, "node-invoice", func(dbURL string) *exec.Cmd {
		cmd := exec.Command("node", "testdata/enqueue.js")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "NODE_PATH="+modules)
		return cmd
	})
}

var transcriptLine = regexp.MustCompile(`^order \d+: (committed|rolled back) (\S+)$`)

// testClient runs a worker for kind, then the script, which enqueues one
// task in a transaction that commits and one in a transaction that rolls
// back, and tries a bad option: the committed task runs and SUCCEEDS; the
// rolled back one left no task, audit or outbox row and no stream entry;
// the bad option was refused with its code and field.
func testClient(t *testing.T, kind string, script func(dbURL string) *exec.Cmd) {
	ctx := context.Background()
	d := testenv.NewDatabase(t)
	stream, dlq := testenv.Keys(t)
	useStream(t, d.Pool, stream)
	rdb := testenv.Redis(t)

	var mu sync.Mutex
	ran := map[uuid.UUID]int{}
	svc, err := ingest.NewService(ingest.Config{Stream: stream, DLQ: dlq, Consumer: kind + "-worker",
		Store: task.Config{Stream: stream}}, d.Pool, ingest.Redis(rdb), nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	svc.Handle(kind, func(_ context.Context, tk ingest.Task) error {
		mu.Lock()
		defer mu.Unlock()
		ran[tk.ID]++
		return nil
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	})

	out, err := script(d.URL).CombinedOutput()
	t.Logf("transcript:\n%s", out)
	if err != nil {
		t.Fatalf("script: %v", err)
	}
	var committed, rolledBack uuid.UUID
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		m := transcriptLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		id := uuid.MustParse(m[2])
		if m[1] == "committed" {
			committed = id
		} else {
			rolledBack = id
		}
	}
	if committed == uuid.Nil || rolledBack == uuid.Nil {
		t.Fatalf("the transcript names no committed and rolled back task")
	}
	if !strings.Contains(string(out), "refused: SQLSTATE 22023, field max_attempts: max_attempts must be a whole number from 1 to 1000000, got 0") {
		t.Errorf("the transcript lacks the refusal of max_attempts 0")
	}

	store := newStore(t, d.Pool, task.Config{Stream: stream})
	testenv.Eventually(t, 30*time.Second, "the committed task to succeed", func() bool {
		tk, err := store.Get(ctx, committed)
		return err == nil && tk.Status == task.Succeeded
	})

	var rows int
	if err := d.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ingest_task WHERE id = $1)
		+ (SELECT count(*) FROM ingest_task_transition WHERE task_id = $1) + (SELECT count(*) FROM outbox_event WHERE task_id = $1)`,
		rolledBack).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("the rolled back task left %d rows, %v; want none", rows, err)
	}
	entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Values["task_id"] != committed.String() {
		t.Errorf("stream entries %v; want one, of the committed task %s", entries, committed)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran[committed] != 1 || len(ran) != 1 {
		t.Errorf("handler runs %v; want the committed task once", ran)
	}
}
