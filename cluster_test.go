package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// clusterBundle is a Service's world on Redis Cluster: a database and a
// three-master cluster of its own, keys sharing one hash tag.
type clusterBundle struct {
	*serviceBundle
	cluster *testenv.RedisCluster
	crdb    *redis.ClusterClient
	master  *testenv.RedisServer // the master serving the stream's slot
}

func newClusterBundle(t *testing.T, o testenv.ClusterOptions) *clusterBundle {
	t.Helper()
	stream, dlq := testenv.Keys(t)
	c := testenv.NewRedisCluster(t, o)
	b := &clusterBundle{serviceBundle: &serviceBundle{t: t, db: testenv.NewDatabase(t), stream: stream, dlq: dlq}, cluster: c, crdb: c.Client(t)}
	var err error
	if b.master, err = c.MasterOf(context.Background(), stream); err != nil {
		t.Fatal(err)
	}
	if m, _ := c.MasterOf(context.Background(), dlq); m != b.master {
		t.Fatalf("stream %s and DLQ %s are on different masters", stream, dlq)
	}
	b.store, err = task.NewStore(task.Config{Stream: stream, Backoff: task.Backoff{Base: 50 * time.Millisecond, Max: time.Second, Jitter: 0.1}}, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run runs a Service of cfg on the cluster client (see serviceBundle.run).
func (b *clusterBundle) run(cfg ingest.Config, handlers map[string]ingest.Handler, level slog.Level) *ingest.Service {
	b.t.Helper()
	cfg.Store = b.store.Config()
	return runService(b.t, cfg, b.db.Pool, b.crdb, handlers, level)
}

// statusOf returns the status and attempt count of task id.
func (b *clusterBundle) statusOf(id uuid.UUID) (task.State, int) {
	b.t.Helper()
	var s string
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT status, attempt_count FROM ingest_task WHERE id = $1`, id).Scan(&s, &n); err != nil {
		b.t.Fatal(err)
	}
	return task.State(s), n
}

// create creates n tasks of kind through the store and returns their ids.
func (b *clusterBundle) create(kind string, n int) []uuid.UUID {
	b.t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`)}
	}
	res, err := b.store.CreateBatch(context.Background(), nts)
	if err != nil {
		b.t.Fatal(err)
	}
	ids := make([]uuid.UUID, len(res))
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	return ids
}

// checkTerminalOnce fails the test unless every task has exactly one
// transition into a terminal state.
func (b *clusterBundle) checkTerminalOnce() {
	b.t.Helper()
	var bad int
	err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM ingest_task t
		WHERE (SELECT count(*) FROM ingest_task_transition r WHERE r.task_id = t.id
		       AND r.to_status IN ('SUCCEEDED', 'DEAD', 'CANCELLED')) <> 1`).Scan(&bad)
	if err != nil {
		b.t.Fatal(err)
	}
	if bad != 0 {
		b.t.Errorf("%d tasks have not exactly one terminal transition", bad)
	}
}

// TestClusterServiceEndToEnd: a Service on a three-master Redis Cluster.
// Tasks succeed; a failed attempt is retried through the reclaimer; a
// permanent failure is DEAD with its DLQ entry written by the DLQ script
// (stream, DLQ and marker keys in one slot); the leader trims the
// acknowledged entries and removes an idle consumer (its Lua script); the
// group's PEL ends empty.
func TestClusterServiceEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newClusterBundle(t, testenv.ClusterOptions{})
	cfg := b.fastConfig("c1")
	cfg.Maintenance.Consumers = maintenance.ConsumersConfig{IdleTimeout: 200 * time.Millisecond, Interval: 100 * time.Millisecond}
	var mu sync.Mutex
	runs := map[uuid.UUID]int{}
	count := func(tk ingest.Task) int {
		mu.Lock()
		defer mu.Unlock()
		runs[tk.ID]++
		return runs[tk.ID]
	}
	svc := b.run(cfg, map[string]ingest.Handler{
		"ok": func(ctx context.Context, tk ingest.Task) error { count(tk); return nil },
		"flaky": func(ctx context.Context, tk ingest.Task) error {
			if count(tk) == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		},
		"broken": func(ctx context.Context, tk ingest.Task) error {
			count(tk)
			return ingest.Permanent(errors.New("cannot be done"))
		},
	}, slog.LevelWarn)
	b.eventually(10*time.Second, "the service leads", svc.Maintainer().IsLeader)
	// Leading comes from PostgreSQL; the worker creates the group on its
	// own schedule.
	b.eventually(10*time.Second, "the consumer group exists", func() bool {
		return b.crdb.XInfoGroups(ctx, b.stream).Err() == nil
	})
	// A consumer that never reads: the idle-consumer cleanup removes it.
	if err := b.crdb.XGroupCreateConsumer(ctx, b.stream, ingest.DefaultGroup, "ghost").Err(); err != nil {
		t.Fatal(err)
	}

	ok, flaky, broken := b.create("ok", 200), b.create("flaky", 20), b.create("broken", 3)
	all := append(append(append([]uuid.UUID{}, ok...), flaky...), broken...)
	b.eventually(30*time.Second, "every task finished", func() bool {
		return b.count(task.Succeeded)+b.count(task.Dead) == len(all)
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ok {
		if s, n := b.statusOf(id); s != task.Succeeded || n != 0 || runs[id] != 1 {
			t.Errorf("ok task %s: %s with %d failed attempts after %d runs, want SUCCEEDED after 1 run", id, s, n, runs[id])
		}
	}
	for _, id := range flaky {
		if s, n := b.statusOf(id); s != task.Succeeded || n != 1 || runs[id] != 2 {
			t.Errorf("flaky task %s: %s with %d failed attempts after %d runs, want SUCCEEDED after a failure and a retry", id, s, n, runs[id])
		}
	}
	dead := map[string]bool{}
	for _, id := range broken {
		if s, _ := b.statusOf(id); s != task.Dead || runs[id] != 1 {
			t.Errorf("broken task %s: %s after %d runs, want DEAD after 1", id, s, runs[id])
		}
		dead[id.String()] = true
	}
	// A DEAD task's entry is written after its DEAD commits, with the
	// acknowledgement of its stream entry: nothing pending, every entry
	// written.
	b.eventually(30*time.Second, "nothing pending before the DLQ is read", func() bool {
		p, err := b.crdb.XPending(ctx, b.stream, ingest.DefaultGroup).Result()
		return err == nil && p.Count == 0
	})
	msgs, err := b.crdb.XRange(ctx, b.dlq, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		id, _ := m.Values["task_id"].(string)
		if !dead[id] {
			t.Errorf("DLQ entry %s of task %q, which is not one dead task left to find", m.ID, id)
		}
		delete(dead, id)
	}
	if len(dead) != 0 {
		t.Errorf("dead tasks without a DLQ entry: %v", dead)
	}
	b.eventually(10*time.Second, "nothing pending, the stream trimmed, the idle consumer removed", func() bool {
		p, err := b.crdb.XPending(ctx, b.stream, ingest.DefaultGroup).Result()
		if err != nil || p.Count != 0 {
			return false
		}
		if l, err := b.crdb.XLen(ctx, b.stream).Result(); err != nil || l != 0 {
			return false
		}
		cs, err := b.crdb.XInfoConsumers(ctx, b.stream, ingest.DefaultGroup).Result()
		if err != nil {
			return false
		}
		for _, c := range cs {
			if c.Name == "ghost" {
				return false
			}
		}
		return true
	})
	b.checkTerminalOnce()
}

// recoveryTasks is INGEST_TEST_RECOVERY_TASKS, or def.
func recoveryTasks(t *testing.T, def int) int {
	if v := os.Getenv("INGEST_TEST_RECOVERY_TASKS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("INGEST_TEST_RECOVERY_TASKS=%q is not a positive whole number", v)
		}
		return n
	}
	return def
}

// TestClusterRecoveryAfterMasterLosesData: the master serving the stream's
// slot is killed while thousands of tasks wait in the stream, and comes
// back empty (no persistence): the stream, the group and every entry are
// gone, the other masters are untouched. With the rescuer's default grace
// (a minute) the tasks still all succeed within seconds of the master's
// return: the consumer that finds its group gone reports the loss, and the
// leader's rescuer runs at once. INGEST_TEST_RECOVERY_TASKS sets the
// number of tasks (default 2,000).
func TestClusterRecoveryAfterMasterLosesData(t *testing.T) {
	t.Parallel()
	n := recoveryTasks(t, 2000)
	ctx := context.Background()
	b := newClusterBundle(t, testenv.ClusterOptions{})
	cfg := b.fastConfig("c1")
	cfg.Maintenance.Rescuer = maintenance.RescuerConfig{} // the defaults: a minute's grace
	gate := make(chan struct{})
	svc := b.run(cfg, map[string]ingest.Handler{"k": func(ctx context.Context, _ ingest.Task) error {
		select {
		case <-gate:
		case <-ctx.Done():
		}
		return nil
	}}, slog.LevelError)
	b.eventually(10*time.Second, "the service leads", svc.Maintainer().IsLeader)
	for i := 0; i < n; i += 1000 {
		b.create("k", min(1000, n-i))
	}
	b.eventually(30*time.Second, "every task in the stream", func() bool {
		l, err := b.crdb.XLen(ctx, b.stream).Result()
		return err == nil && l >= int64(n)
	})
	killed := time.Now()
	b.cluster.Kill(b.master)
	if err := b.cluster.Restart(ctx, b.master); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	if l, err := b.crdb.XLen(ctx, b.stream).Result(); err != nil || l >= int64(n) {
		t.Fatalf("after the restart the stream has %d entries (%v): the master did not lose its data", l, err)
	}
	close(gate)
	b.eventually(40*time.Second, "every task SUCCEEDED after the master came back", func() bool {
		return b.count(task.Succeeded) == n
	})
	t.Logf("%d tasks: all SUCCEEDED %s after the stream's master came back empty (%s after it was killed; rescuer grace %s)",
		n, time.Since(back).Round(10*time.Millisecond), time.Since(killed).Round(10*time.Millisecond), time.Minute)
	// Seconds, not the rescuer's grace of a minute: the bound is well
	// below that and well above the seconds it takes.
	if d := time.Since(back); d > 30*time.Second {
		t.Errorf("recovery took %s, want well within the rescuer's grace (a minute) of Redis coming back", d.Round(10*time.Millisecond))
	}
	b.checkTerminalOnce()
}

// TestClusterMasterFaultMidRun: tasks are created and worked without a
// pause while the master serving the stream's slot is killed: started
// again empty (Restart; the loss is reported and the rescuer republishes),
// or replaced by its replica (Failover, a node timeout of 1 s; the last
// writes before the kill may be lost). Publishes fail meanwhile (the
// outbox keeps the events and retries), entries held by the handlers may
// vanish; every task still ends SUCCEEDED, exactly once in its audit
// trail, and nothing stays pending.
func TestClusterMasterFaultMidRun(t *testing.T) {
	t.Parallel()
	t.Run("Restart", func(t *testing.T) {
		t.Parallel()
		testClusterMasterFaultMidRun(t, testenv.ClusterOptions{}, func(b *clusterBundle) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := b.cluster.Restart(ctx, b.master); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("Failover", func(t *testing.T) {
		t.Parallel()
		testClusterMasterFaultMidRun(t, testenv.ClusterOptions{Replicas: true, NodeTimeout: time.Second}, func(b *clusterBundle) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			m, err := b.cluster.WaitFailover(ctx, b.stream, b.master)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("replica %s took over from %s", m.Addr(), b.master.Addr())
		})
	})
}

// testClusterMasterFaultMidRun kills the stream's master mid-run and calls
// repair once publishes have failed.
func testClusterMasterFaultMidRun(t *testing.T, o testenv.ClusterOptions, repair func(b *clusterBundle)) {
	ctx := context.Background()
	b := newClusterBundle(t, o)
	var mu sync.Mutex
	seen := map[uuid.UUID]bool{}
	svc := b.run(b.fastConfig("c1"), map[string]ingest.Handler{"k": func(ctx context.Context, tk ingest.Task) error {
		mu.Lock()
		seen[tk.ID] = true
		mu.Unlock()
		time.Sleep(time.Millisecond) // work in flight when the master goes
		return nil
	}}, slog.LevelError)
	b.eventually(10*time.Second, "the service leads", svc.Maintainer().IsLeader)

	// The producer creates tasks through the service's store (direct
	// publishing) until stopped, whatever Redis does.
	var created atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			nts := make([]task.NewTask, 10)
			for j := range nts {
				nts[j] = task.NewTask{Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i*10+j))}
			}
			if _, err := svc.Store().CreateBatch(ctx, nts); err != nil {
				done <- err
				return
			}
			created.Add(int64(len(nts)))
			time.Sleep(5 * time.Millisecond) // a steady trickle, not a flood
		}
	}()
	b.eventually(30*time.Second, "tasks flowing before the fault", func() bool { return b.count(task.Succeeded) >= 200 })
	b.cluster.Kill(b.master)
	killed := time.Now()
	before := created.Load()
	// While the master is down the relay's publishes fail and are kept.
	b.eventually(20*time.Second, "failed publishes while the master is down", func() bool {
		var failed int
		err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE attempt_count > 0 AND status <> 'SENT'`).Scan(&failed)
		return err == nil && failed > 0
	})
	repair(b)
	repaired := time.Since(killed)
	b.eventually(30*time.Second, "tasks created after the recovery", func() bool { return created.Load() >= before+200 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	total := int(created.Load())
	b.eventually(60*time.Second, "every task SUCCEEDED", func() bool { return b.count(task.Succeeded) == total })
	took := time.Since(killed)
	t.Logf("the cluster was ok again %s after the kill; all %d tasks SUCCEEDED %s after it (%d created before it)",
		repaired.Round(10*time.Millisecond), total, took.Round(10*time.Millisecond), before)
	// Seconds, not the minute of go-redis's default slot-map reload: the
	// bound is well below that and well above the seconds it takes.
	if took > 45*time.Second {
		t.Errorf("every task SUCCEEDED %s after the kill, want well within a minute", took.Round(10*time.Millisecond))
	}
	b.eventually(10*time.Second, "nothing pending", func() bool {
		p, err := b.crdb.XPending(ctx, b.stream, ingest.DefaultGroup).Result()
		return err == nil && p.Count == 0
	})
	mu.Lock()
	if len(seen) != total {
		t.Errorf("handler saw %d distinct tasks, want %d", len(seen), total)
	}
	mu.Unlock()
	if n := b.count(task.Dead); n != 0 {
		t.Errorf("%d tasks DEAD, want 0", n)
	}
	b.checkTerminalOnce()
}

// TestClusterPriorities: on Redis Cluster, the priority streams of a
// hash-tagged stream key share its slot, so one read script reaches them
// all; tasks of every priority are published to their streams and run, and
// nothing stays pending.
func TestClusterPriorities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newClusterBundle(t, testenv.ClusterOptions{})
	for _, p := range stream.Priorities {
		if m, err := b.cluster.MasterOf(ctx, stream.Key(b.stream, p)); err != nil || m != b.master {
			t.Fatalf("priority %d stream %s not on the stream's master (%v)", p, stream.Key(b.stream, p), err)
		}
	}
	var ids []uuid.UUID
	for _, p := range stream.Priorities {
		res, err := b.store.Create(ctx, task.NewTask{Kind: "ok", Payload: json.RawMessage(`{}`), Priority: p})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.Task.ID)
	}
	b.run(b.fastConfig("c1"), map[string]ingest.Handler{"ok": func(context.Context, ingest.Task) error { return nil }}, slog.LevelError)
	b.eventually(30*time.Second, "every task SUCCEEDED", func() bool {
		for _, id := range ids {
			if s, _ := b.statusOf(id); s != task.Succeeded {
				return false
			}
		}
		return true
	})
	for i, p := range stream.Priorities {
		key := stream.Key(b.stream, p)
		// Published there (retention may have trimmed the entry since).
		var streams []string
		if err := b.db.Pool.QueryRow(ctx, `SELECT array_agg(stream) FROM outbox_event WHERE task_id = $1 AND status = 'SENT'`, ids[i]).Scan(&streams); err != nil ||
			len(streams) != 1 || streams[0] != key {
			t.Errorf("priority %d: published to %v, %v; want %s", p, streams, err, key)
		}
		// Acknowledged once the success has committed: awaited, not
		// assumed at the moment the task reads SUCCEEDED.
		b.eventually(30*time.Second, fmt.Sprintf("no entry of priority %d pending", p), func() bool {
			pend, err := b.crdb.XPending(ctx, key, ingest.DefaultGroup).Result()
			return err == nil && pend.Count == 0
		})
	}
}
