package ingest_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// TestRecoveryFromRedisDataLoss: Redis loses everything (FLUSHALL) while
// thousands of tasks wait in the stream. With the rescuer's default grace
// (a minute) and interval (30 s), the tasks still all succeed within
// seconds: the consumer that finds its group gone reports the loss, and
// the leader's rescuer runs at once without the grace.
// INGEST_TEST_RECOVERY_TASKS sets the number of tasks (default 2,000).
func TestRecoveryFromRedisDataLoss(t *testing.T) {
	t.Parallel()
	n := 2000
	if v := os.Getenv("INGEST_TEST_RECOVERY_TASKS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("INGEST_TEST_RECOVERY_TASKS=%q: %v", v, err)
		}
	}
	ctx := context.Background()
	b := newServiceBundle(t)
	cfg := b.fastConfig("w1")
	cfg.Maintenance.Rescuer = maintenance.RescuerConfig{} // the defaults: a minute's grace
	if d := cfg.Maintenance.Rescuer.WithDefaults(); d.Grace != time.Minute || d.Interval != 30*time.Second {
		t.Fatalf("rescuer defaults %+v: the test assumes a minute's grace and 30 s between passes", d)
	}
	gate := make(chan struct{})
	svc := b.run(cfg, map[string]ingest.Handler{"k": func(ctx context.Context, _ ingest.Task) error {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return nil
	}}, slog.LevelWarn)
	b.eventually(10*time.Second, "the service leads", svc.Maintainer().IsLeader)

	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)}
	}
	for i := 0; i < n; i += 1000 {
		if _, err := svc.Store().CreateBatch(ctx, nts[i:min(i+1000, n)]); err != nil {
			t.Fatal(err)
		}
	}
	b.eventually(30*time.Second, "every task in the stream", func() bool {
		l, err := b.rdb.XLen(ctx, b.stream).Result()
		return err == nil && l >= int64(n)
	})
	if err := b.rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	close(gate)
	succeeded := func() bool {
		var k int
		err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task WHERE status = 'SUCCEEDED'`).Scan(&k)
		return err == nil && k == n
	}
	// Well within the rescuer's grace: only the reported loss can do it.
	b.eventually(40*time.Second, "every task SUCCEEDED after the loss", succeeded)
	t.Logf("%d tasks: all SUCCEEDED %s after FLUSHALL (rescuer grace %s)", n, time.Since(lost).Round(10*time.Millisecond), time.Minute)
}
