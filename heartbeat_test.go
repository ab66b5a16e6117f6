package ingest_test

import (
	"context"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// TestHeartbeatRenewsLeasesWhileRedisIsFrozen: a frozen Redis (SIGSTOP)
// must not stop the renewal of running tasks' leases in Postgres; if it
// did, another worker could take a task over and run it twice.
func TestHeartbeatRenewsLeasesWhileRedisIsFrozen(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	cfg := b.fastConfig("w1")
	cfg.TaskLease = 900 * time.Millisecond
	cfg.ReclaimIdle = 2 * time.Second
	started, release := make(chan struct{}), make(chan struct{})
	b.start(cfg, func(ctx context.Context, tk ingest.Task) error {
		close(started)
		<-release
		return nil
	})
	b.enqueue(1)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the task did not start")
	}

	b.redis.Pause()
	frozenUntil := time.Now().Add(3 * time.Second) // > 3 leases
	for time.Now().Before(frozenUntil) {
		var live bool
		if err := b.db.Pool.QueryRow(context.Background(),
			`SELECT lease_until > now() FROM ingest_task WHERE status = 'RUNNING'`).Scan(&live); err != nil || !live {
			b.redis.Resume()
			t.Fatalf("the running task's lease lapsed while Redis was frozen (live=%v err=%v)", live, err)
		}
		time.Sleep(50 * time.Millisecond) // sampling interval of the lease
	}
	b.redis.Resume()
	close(release)

	b.eventually(30*time.Second, "the task SUCCEEDED", func() bool { return b.count(task.Succeeded) == 1 })
	var path string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT string_agg(coalesce(from_status, '-') || '>' || to_status, ' ' ORDER BY id)
		FROM ingest_task_transition`).Scan(&path); err != nil {
		t.Fatal(err)
	}
	if want := "->QUEUED QUEUED>RUNNING RUNNING>SUCCEEDED"; path != want {
		t.Errorf("transitions %q, want %q (no takeover)", path, want)
	}
}
