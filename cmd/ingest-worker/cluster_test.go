package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/webhook"
)

// TestClusterWorkers runs the binary against a three-master Redis Cluster
// (INGEST_REDIS_CLUSTER=true): two worker processes, one of them SIGKILLed
// while its webhook requests hang, whose tasks then finish on the other;
// a success path, a retry, DEAD tasks in the DLQ, and the CLI's view of the
// cluster (task show with its PEL entry, pending, dlq list, dlq replay).
// Keys without a shared hash tag stop start-up. The demo runs its script
// on the same cluster.
func TestClusterWorkers(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	cluster := testenv.NewRedisCluster(t, testenv.ClusterOptions{})
	t.Run("KillAndCLI", func(t *testing.T) { t.Parallel(); testClusterWorkers(t, bin, cluster) })
	t.Run("Demo", func(t *testing.T) { t.Parallel(); testClusterDemo(t, bin, cluster) })
	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()
		// A cluster URL whose nodes do not answer: exit 1 naming the URL,
		// without its password.
		dead := freeAddr(t)
		url := "redis://:cluster-secret-1@" + dead + "?addr=" + freeAddr(t)
		r := runBin(t, bin, []string{"INGEST_DATABASE_URL=postgres://127.0.0.1:1/x", "INGEST_REDIS_CLUSTER=true", "INGEST_REDIS_URL=" + url,
			"INGEST_REDIS_STREAM_KEY={q}:tasks", "INGEST_REDIS_DLQ_STREAM_KEY={q}:dlq"}, "", "dlq", "list")
		if r.code != exitRuntime || !strings.Contains(r.stderr, "connect to Redis Cluster") || !strings.Contains(r.stderr, dead) ||
			strings.Contains(r.stderr, "cluster-secret-1") {
			t.Fatalf("dlq list against an unreachable cluster: exit %d, stderr %q; want 1 naming the cluster, not its password", r.code, r.stderr)
		}
	})
}

// testClusterDemo: `demo` against a cluster (INGEST_REDIS_URL set, so no
// in-process Redis) gives the script's outcome, and its redis-cli
// commands follow the cluster's redirects.
func testClusterDemo(t *testing.T, bin string, cluster *testenv.RedisCluster) {
	db := testenv.NewEmptyDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	r := runBin(t, bin, []string{"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_CLUSTER=true", "INGEST_REDIS_URL=" + cluster.URL(),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey}, "", "demo", "--json")
	if r.code != 0 {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	var sum demoSummary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil {
		t.Fatalf("demo --json output: %v\n%s", err, r.stdout)
	}
	wantOK, wantDead := demoOK+demoFlaky, demoBroken+1
	if sum.Tasks != wantOK+wantDead || sum.ByStatus["SUCCEEDED"] != wantOK || sum.ByStatus["DEAD"] != wantDead || len(sum.DLQ) != wantDead {
		t.Fatalf("demo summary %+v: want %d SUCCEEDED, %d DEAD and %d DLQ entries", sum, wantOK, wantDead, wantDead)
	}
	if cmds := strings.Join(sum.Commands, "\n"); !strings.Contains(cmds, "redis-cli -c -u 'redis://"+cluster.Masters[0].Addr()+"'") {
		t.Errorf("demo commands %q lack redis-cli -c of the first node", sum.Commands)
	}
}

func testClusterWorkers(t *testing.T, bin string, cluster *testenv.RedisCluster) {
	ctx := context.Background()
	crdb := cluster.Client(t)
	db := testenv.NewEmptyDatabase(t)
	stream, dlqKey := testenv.Keys(t)

	var hold, reject atomic.Bool
	hold.Store(true)
	reject.Store(true)
	var fmu sync.Mutex
	flakyRuns := map[uuid.UUID]int{}
	rc, hook := newReceiver(t, func(w http.ResponseWriter, r *http.Request, req webhook.Request) {
		switch req.Kind {
		case "c.slow":
			if hold.Load() { // until the worker dies or gives up
				<-r.Context().Done()
				return
			}
		case "c.flaky":
			fmu.Lock()
			flakyRuns[req.TaskID]++
			first := flakyRuns[req.TaskID] == 1
			fmu.Unlock()
			if first {
				http.Error(w, "try again", http.StatusServiceUnavailable)
				return
			}
		case "c.bad":
			if reject.Load() {
				http.Error(w, "no such account", http.StatusBadRequest)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
	env := []string{
		"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_CLUSTER=true", "INGEST_REDIS_URL=" + cluster.URL(),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_WEBHOOK_URL=" + hook.URL + "/hook", "INGEST_WORKER_CONCURRENCY=4",
		// A killed worker's tasks are taken over within a couple of seconds;
		// a failed attempt is retried at once, at the next reclaim round.
		"INGEST_TASK_LEASE_MS=1500", "INGEST_REDIS_RECLAIM_IDLE_MS=1000", "INGEST_REDIS_RECLAIM_INTERVAL_MS=200",
		"INGEST_REDIS_RETRY_BASE_BACKOFF_MS=0", "INGEST_REDIS_RETRY_MAX_BACKOFF_MS=0", "INGEST_OUTBOX_PUBLISH_INTERVAL_MS=100",
	}

	// Keys in different slots: start-up refuses them.
	r := runBin(t, bin, append(env, "INGEST_REDIS_STREAM_KEY=ingest:tasks", "INGEST_REDIS_DLQ_STREAM_KEY=ingest:tasks:dlq"), "", "run")
	if r.code != exitUsage || !strings.Contains(r.stderr, "INGEST_REDIS_DLQ_STREAM_KEY") || !strings.Contains(r.stderr, "hash tag") {
		t.Fatalf("run with keys without a hash tag: exit %d, stderr %q; want 2 naming the hash tag", r.code, r.stderr)
	}

	mustRun(t, bin, env, "", "migrate")
	enqueue := func(kind string, n int) []uuid.UUID {
		t.Helper()
		var ids []uuid.UUID
		for range n {
			ids = append(ids, uuid.MustParse(strings.TrimSpace(mustRun(t, bin, env, "", "enqueue", "--kind", kind, "--payload", `{}`))))
		}
		return ids
	}
	status := func(id uuid.UUID) string {
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT status FROM ingest_task WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	allIn := func(ids []uuid.UUID, want string) bool {
		for _, id := range ids {
			if status(id) != want {
				return false
			}
		}
		return true
	}

	// Worker a takes the slow tasks and hangs in their webhook requests.
	nameA, nameB := "ca-"+uuid.NewString()[:6], "cb-"+uuid.NewString()[:6]
	addrA := freeAddr(t)
	a := start(t, bin, append(env, "INGEST_CONSUMER_NAME="+nameA), "run", "--http-addr", addrA)
	waitReady(t, a, addrA)
	slow := enqueue("c.slow", 3)
	testenv.Eventually(t, 30*time.Second, "worker a running the slow tasks", func() bool {
		a.mustBeRunning()
		for _, id := range slow {
			if rc.count(id) == 0 {
				return false
			}
		}
		return true
	})
	// task show and pending see a's PEL on the cluster.
	var show taskDetail
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "task", "show", slow[0].String(), "--json")), &show); err != nil {
		t.Fatal(err)
	}
	if show.Task.Status != "RUNNING" || len(show.Redis.Entries) != 1 || !show.Redis.Entries[0].Pending ||
		show.Redis.Entries[0].Consumer != nameA || show.Redis.Error != "" {
		t.Fatalf("task show of a running task: %+v, want RUNNING with its entry pending at %s", show, nameA)
	}
	var pend pendingReport
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "pending", "--json")), &pend); err != nil {
		t.Fatal(err)
	}
	if !pend.GroupExists || pend.Pending != 3 || len(pend.Consumers) == 0 || pend.Consumers[0].Name != nameA || pend.Consumers[0].Pending != 3 {
		t.Fatalf("pending while a runs the slow tasks: %+v, want 3 pending at %s", pend, nameA)
	}

	// b starts; a is SIGKILLed; the slow tasks finish on b.
	addrB := freeAddr(t)
	b := start(t, bin, append(env, "INGEST_CONSUMER_NAME="+nameB), "run", "--http-addr", addrB)
	waitReady(t, b, addrB)
	a.signal(syscall.SIGKILL)
	a.wait(10 * time.Second)
	hold.Store(false)
	testenv.Eventually(t, 30*time.Second, "the killed worker's tasks SUCCEEDED on the other", func() bool {
		b.mustBeRunning()
		return allIn(slow, "SUCCEEDED")
	})
	for _, id := range slow {
		if rc.count(id) < 2 {
			t.Errorf("slow task %s was sent %d times, want a second run after the kill", id, rc.count(id))
		}
	}

	// The success path, a retry, and deaths into the DLQ.
	ok, flaky, bad := enqueue("c.ok", 10), enqueue("c.flaky", 3), enqueue("c.bad", 2)
	testenv.Eventually(t, 30*time.Second, "ok and flaky tasks SUCCEEDED, bad ones DEAD", func() bool {
		b.mustBeRunning()
		return allIn(ok, "SUCCEEDED") && allIn(flaky, "SUCCEEDED") && allIn(bad, "DEAD")
	})
	for _, id := range flaky {
		if n := rc.count(id); n != 2 {
			t.Errorf("flaky task %s was sent %d times, want 2 (a failure, a retry)", id, n)
		}
	}
	var list struct {
		Length  int64       `json:"length"`
		Entries []dlq.Entry `json:"entries"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "dlq", "list", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	inDLQ := map[string]bool{}
	for _, e := range list.Entries {
		inDLQ[e.TaskID] = true
	}
	if list.Length != 2 || len(inDLQ) != 2 || !inDLQ[bad[0].String()] || !inDLQ[bad[1].String()] {
		t.Fatalf("dlq list: %+v, want the two dead tasks", list)
	}
	show = taskDetail{}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "task", "show", bad[0].String(), "--json")), &show); err != nil {
		t.Fatal(err)
	}
	if show.Task.Status != "DEAD" || len(show.Redis.DLQ) != 1 || show.Redis.Error != "" {
		t.Fatalf("task show of a dead task: %+v, want DEAD with its DLQ entry", show)
	}

	// Replayed, the dead tasks run again and succeed; the DLQ is empty.
	reject.Store(false)
	var replay struct {
		Results []dlq.ReplayResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "dlq", "replay", "--all", "--json")), &replay); err != nil {
		t.Fatal(err)
	}
	if len(replay.Results) != 2 || replay.Results[0].Outcome != dlq.Replayed || replay.Results[1].Outcome != dlq.Replayed {
		t.Fatalf("dlq replay --all: %+v, want two entries replayed", replay.Results)
	}
	testenv.Eventually(t, 30*time.Second, "the replayed tasks SUCCEEDED", func() bool {
		b.mustBeRunning()
		return allIn(bad, "SUCCEEDED")
	})
	if l, err := crdb.XLen(ctx, dlqKey).Result(); err != nil || l != 0 {
		t.Errorf("DLQ length %d (%v) after the replay, want 0", l, err)
	}
	testenv.Eventually(t, 10*time.Second, "nothing pending", func() bool {
		pend = pendingReport{}
		if err := json.Unmarshal([]byte(mustRun(t, bin, env, "", "pending", "--json")), &pend); err != nil {
			t.Fatal(err)
		}
		return pend.Pending == 0
	})
	if c := statusCounts(t, db.Pool); c["SUCCEEDED"] != 18 || len(c) != 1 {
		t.Errorf("tasks by status %v, want 18 SUCCEEDED and nothing else", c)
	}
	b.signal(syscall.SIGTERM)
	if code := b.wait(30 * time.Second); code != 0 {
		t.Errorf("worker b exited %d after SIGTERM:\n%s", code, b.stderr.String())
	}
}
