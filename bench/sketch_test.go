package bench_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/internal/testenv"
)

// TestOutboxSketch runs bench/outbox-sketch.sql, small, on a freshly
// migrated database. The script fails on its own checks: the snapshot
// design publishes every row exactly once, its view shows each row SENT
// with its own entry id, the rows of a transaction that took its ids
// first and committed after a pass are published by the next pass, and
// the handoff design writes every row into outbox_event once, SENT with
// its entry id. It must also leave the outbox and its own objects gone.
func TestOutboxSketch(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		dir, derr := pgtemp.BinDir()
		if derr != nil {
			t.Fatalf("no psql on PATH (%v) and no PostgreSQL binaries: %v", err, derr)
		}
		psql = filepath.Join(dir, "psql")
	}
	d := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, psql, "-X", "-d", d.URL, "-v", "rows=2000", "-f", "outbox-sketch.sql").CombinedOutput()
	if err != nil {
		t.Fatalf("psql -f outbox-sketch.sql: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "commit order: 1000 rows published by the first pass") {
		t.Errorf("no commit-order line in the output:\n%s", out)
	}
	for _, design := range []string{"today", "log", "snapshot", "handoff", "today, held", "snapshot, held", "handoff, held"} {
		if !strings.Contains(string(out), " "+design+" ") {
			t.Errorf("no %q round in the output:\n%s", design, out)
		}
	}
	var left int
	if err := d.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_event)
		+ (SELECT count(*) FROM pg_class WHERE relname LIKE 'sketch%')
		+ (SELECT count(*) FROM pg_proc WHERE proname LIKE 'sketch%')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("the script left %d outbox rows or objects of its own", left)
	}
}
