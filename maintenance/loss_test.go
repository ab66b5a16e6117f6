package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
)

// TestReportedLossRescuesAtOnce: Redis lost the stream; a follower reports
// it; the leader's rescuer, whose grace and interval (an hour each) would
// leave the tasks alone for an hour, rescues every one of them at once,
// walking all its pages (three here) in one urgent rescue.
func TestReportedLossRescuesAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := newDedicatedRedis(t)
	b := setupWith(t, rdb)
	if err := rdb.XGroupCreateMkStream(ctx, b.stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	ids := b.create(t, 30)
	b.publishAll(t)
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := maintenance.Config{
		Rescuer:           maintenance.RescuerConfig{Stream: b.stream, Interval: time.Hour, Grace: time.Hour, BatchSize: 10, PagesPerRun: 1},
		RetentionDisabled: true, ConsumersDisabled: true,
	}
	var ms []*maintenance.Maintainer
	for range 2 {
		m, err := maintenance.New(cfg, b.db, rdb, testLogger(t), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- m.Run(runCtx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
		ms = append(ms, m)
	}
	var follower *maintenance.Maintainer
	testenv.Eventually(t, 10*time.Second, "a leader", func() bool {
		switch {
		case ms[0].IsLeader():
			follower = ms[1]
		case ms[1].IsLeader():
			follower = ms[0]
		}
		return follower != nil
	})
	// A report is a NOTIFY: the leader hears it once it LISTENs (it does
	// so as it starts leading, on a connection of its own).
	testenv.Eventually(t, 10*time.Second, "the leader listening", func() bool {
		var n int
		err := b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := follower.ReportRedisLoss(ctx, "test: the stream is gone"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "every task rescued", func() bool {
		for _, id := range ids {
			if all, _ := b.rows(t, id); all != 2 {
				return false
			}
		}
		return true
	})
}
