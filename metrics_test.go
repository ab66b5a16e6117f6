package ingest_test

import (
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// ingest_stream_pending_overdue_seconds says how long the most overdue
// pending entry has waited beyond the reclaim idle time: 0 while every
// pending entry is younger than that, the excess once one is older.
func TestPendingOverdueGauge(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		const reclaimIdle = 3 * time.Second
		// The worker is not run: it only exports the gauges, and a ghost
		// consumer holds the entries.
		_, reg := bd.worker(ingest.Config{ReclaimIdle: reclaimIdle}, nil)
		labels := map[string]string{"stream": bd.stream, "group": bd.group}
		overdue := func() float64 { return metric(t, reg, "ingest_stream_pending_overdue_seconds", labels) }
		if err := bd.rdb.XGroupCreateMkStream(bd.ctx, bd.stream, bd.group, "0").Err(); err != nil {
			t.Fatal(err)
		}
		if mfs, err := reg.Gather(); err != nil || !slices.ContainsFunc(mfs, func(mf *dto.MetricFamily) bool {
			return mf.GetName() == "ingest_stream_pending_overdue_seconds"
		}) {
			t.Fatalf("ingest_stream_pending_overdue_seconds is not exported (gather error: %v)", err)
		}

		var ids []string
		for range 2 {
			id, err := bd.rdb.XAdd(bd.ctx, &redis.XAddArgs{Stream: bd.stream, Values: []any{"task_id", "x", "kind", "k"}}).Result()
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		if err := bd.rdb.XReadGroup(bd.ctx, &redis.XReadGroupArgs{Group: bd.group, Consumer: "ghost", Streams: []string{bd.stream, ">"}, Count: 2}).Err(); err != nil {
			t.Fatal(err)
		}
		// Idle below the reclaim idle time: not overdue.
		bd.setIdle(ids[0], reclaimIdle/2)
		bd.setIdle(ids[1], reclaimIdle/2)
		if got := overdue(); got != 0 {
			t.Errorf("with no entry idle beyond %s: overdue = %v, want 0", reclaimIdle, got)
		}
		// One entry idle for reclaimIdle+5s: overdue by 5s (plus the
		// moments the test takes).
		bd.setIdle(ids[1], reclaimIdle+5*time.Second)
		if got := overdue(); got < 5 || got >= 6 {
			t.Errorf("with an entry idle %s beyond %s: overdue = %v s, want 5 to 6", 5*time.Second, reclaimIdle, got)
		}
	})
}

// setIdle sets a pending entry's idle time (XCLAIM to its owner ... IDLE).
func (bd *bundle) setIdle(id string, idle time.Duration) {
	bd.t.Helper()
	owner, err := bd.rdb.XPendingExt(bd.ctx, &redis.XPendingExtArgs{Stream: bd.stream, Group: bd.group, Start: id, End: id, Count: 1}).Result()
	if err != nil || len(owner) != 1 {
		bd.t.Fatalf("xpending %s: %v %v", id, owner, err)
	}
	if err := bd.rdb.Do(bd.ctx, "XCLAIM", bd.stream, bd.group, owner[0].Consumer, 0, id, "IDLE", idle.Milliseconds(), "JUSTID").Err(); err != nil {
		bd.t.Fatal(err)
	}
}
