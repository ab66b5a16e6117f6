package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/webhook"
)

// TestSeedRecipe runs the seed system's local reproduction (5.1) verbatim
// against real PostgreSQL and Redis: INGEST_REDIS_MAX_ATTEMPTS=2, zero
// retry backoff and zero reclaim idle, a handler that always fails. The
// first failure leaves the task RETRYING with attempt_count 1; after the
// reclaim it is DEAD with attempt_count 2, the DLQ holds it once, and
// XPENDING is empty. Then the same with several worker processes.
func TestSeedRecipe(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	t.Run("OneWorker", func(t *testing.T) { t.Parallel(); testSeedRecipe(t, bin, 1, 1) })
	t.Run("ThreeWorkers", func(t *testing.T) { t.Parallel(); testSeedRecipe(t, bin, 3, 12) })
}

func testSeedRecipe(t *testing.T, bin string, workers, tasks int) {
	ctx := context.Background()
	db := testenv.NewEmptyDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	rdb := testenv.Redis(t)
	rc, hook := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, req webhook.Request) {
		http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
	})
	base := []string{
		"INGEST_DATABASE_URL=" + db.URL, "INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + stream, "INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_WEBHOOK_URL=" + hook.URL + "/hook",
	}
	env := append(base,
		// The recipe's settings, verbatim.
		"INGEST_REDIS_MAX_ATTEMPTS=2",
		"INGEST_REDIS_RETRY_BASE_BACKOFF_MS=0",
		"INGEST_REDIS_RETRY_MAX_BACKOFF_MS=0",
		"INGEST_REDIS_RECLAIM_IDLE_MS=0",
	)
	mustRun(t, bin, env, "", "migrate")
	for i := range workers {
		addr := freeAddr(t)
		p := start(t, bin, append(env, fmt.Sprintf("INGEST_CONSUMER_NAME=recipe-%d-%s", i, uuid.NewString()[:6])), "run", "--http-addr", addr)
		waitReady(t, p, addr)
	}

	// Tasks are enqueued by a process without INGEST_REDIS_MAX_ATTEMPTS
	// (its default is 10): the workers' 2 governs them.
	var ids []uuid.UUID
	for range tasks {
		out := strings.TrimSpace(mustRun(t, bin, base, "", "enqueue", "--kind", "seed.recipe", "--payload", `{"doc":"x"}`))
		ids = append(ids, uuid.MustParse(out))
	}
	// A task's own max_attempts wins.
	own := uuid.MustParse(strings.TrimSpace(mustRun(t, bin, base, "", "enqueue", "--kind", "seed.own", "--payload", `{}`, "--max-attempts", "3")))

	// The first failure: RETRYING with attemptCount=1 (the reclaim runs
	// the retry at the next round, INGEST_REDIS_RECLAIM_INTERVAL_MS).
	var mu sync.Mutex
	sawRetrying := map[uuid.UUID]bool{}
	testenv.Eventually(t, 60*time.Second, "every task DEAD with attempt_count 2", func() bool {
		rows, err := db.Pool.Query(ctx, `SELECT id, status, attempt_count FROM ingest_task WHERE id = ANY($1)`, ids)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		dead := 0
		for rows.Next() {
			var id uuid.UUID
			var status string
			var attempts int
			if err := rows.Scan(&id, &status, &attempts); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			switch {
			case status == "RETRYING" && attempts == 1:
				sawRetrying[id] = true
			case status == "DEAD" && attempts == 2:
				dead++
			case status == "DEAD":
				t.Fatalf("task %s DEAD with attempt_count %d, want 2", id, attempts)
			}
			mu.Unlock()
		}
		return dead == len(ids)
	})
	// RETRYING lasts until the next reclaim round, seconds with the
	// default interval; the audit trail has it for every task either way.
	var retryingRows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ingest_task_transition
		WHERE task_id = ANY($1) AND from_status = 'RUNNING' AND to_status = 'RETRYING' AND attempt_count = 1`, ids).Scan(&retryingRows); err != nil {
		t.Fatal(err)
	}
	if retryingRows != len(ids) {
		t.Errorf("audit rows RUNNING→RETRYING with attempt_count 1: %d, want %d", retryingRows, len(ids))
	}
	// The audit rows above prove each task was RETRYING between its
	// attempts; catching a row in that state by polling depends on the
	// machine's speed (a loaded one may poll past the whole window), so it
	// is only reported.
	t.Logf("tasks seen RETRYING with attempt_count 1 by polling: %d of %d", len(sawRetrying), len(ids))
	for _, id := range ids {
		if n := rc.count(id); n != 2 {
			t.Errorf("task %s ran %d times, want 2", id, n)
		}
	}
	testenv.Eventually(t, 60*time.Second, "the task with max_attempts 3 DEAD after 3 runs", func() bool {
		var status string
		var attempts int
		if err := db.Pool.QueryRow(ctx, `SELECT status, attempt_count FROM ingest_task WHERE id = $1`, own).Scan(&status, &attempts); err != nil {
			t.Fatal(err)
		}
		if status == "DEAD" && attempts != 3 {
			t.Fatalf("task with max_attempts 3 DEAD with attempt_count %d", attempts)
		}
		return status == "DEAD"
	})
	if n := rc.count(own); n != 3 {
		t.Errorf("task with max_attempts 3 ran %d times, want 3", n)
	}
	ids = append(ids, own)

	// The DLQ holds each task once; XPENDING is empty. A task's entry is
	// written after its DEAD commits: it is awaited.
	inDLQ := map[string]int{}
	testenv.Eventually(t, 30*time.Second, "a DLQ entry of every task", func() bool {
		msgs, err := rdb.XRange(ctx, dlqKey, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		clear(inDLQ)
		for _, m := range msgs {
			id, _ := m.Values["task_id"].(string)
			inDLQ[id]++
		}
		for _, id := range ids {
			if inDLQ[id.String()] == 0 {
				return false
			}
		}
		return true
	})
	for _, id := range ids {
		if inDLQ[id.String()] != 1 {
			t.Errorf("task %s has %d DLQ entries, want 1", id, inDLQ[id.String()])
		}
	}
	testenv.Eventually(t, 10*time.Second, "XPENDING empty", func() bool {
		p, err := rdb.XPending(ctx, stream, "ingest-workers").Result()
		return err == nil && p.Count == 0
	})
}
