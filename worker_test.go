package ingest_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

func noop(context.Context, ingest.Task) error { return nil }

var fastBackoff = task.Backoff{Base: 50 * time.Millisecond, Max: 50 * time.Millisecond}

func TestProcess500Tasks(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		const n = 500
		ids := bd.enqueue("noop", n, 0)
		w, reg := bd.worker(ingest.Config{}, map[string]ingest.Handler{"noop": noop})
		began := time.Now()
		bd.run(w)
		bd.eventually(2*time.Minute, "all SUCCEEDED", func() bool { return bd.countStatus(task.Succeeded) == n })
		elapsed := time.Since(began)
		bd.eventually(5*time.Second, "XPENDING empty", func() bool { return bd.pending() == 0 })
		t.Logf("%s: %d tasks in %s: %.0f tasks/s (concurrency %d, -race slows this)", b.Name, n, elapsed.Round(time.Millisecond),
			n/elapsed.Seconds(), w.Config().Concurrency)

		var wrong int
		if err := bd.db.QueryRow(bd.ctx, `SELECT count(*) FROM (SELECT task_id FROM ingest_task_transition
			GROUP BY task_id HAVING count(*) <> 3 OR array_agg(to_status ORDER BY id) <> '{QUEUED,RUNNING,SUCCEEDED}') x`).Scan(&wrong); err != nil {
			t.Fatal(err)
		}
		if wrong != 0 {
			t.Errorf("%d tasks do not have exactly QUEUED→RUNNING→SUCCEEDED; e.g. %s", wrong, bd.path(ids[0]))
		}
		awaitMetric(t, reg, "ingest_task_process_total", result("succeeded"), n)
		if got := metric(t, reg, "ingest_stream_length", map[string]string{"stream": bd.stream}); got != n {
			t.Errorf("ingest_stream_length = %v, want %d", got, n)
		}
		if got := metric(t, reg, "ingest_stream_pending", map[string]string{"stream": bd.stream, "group": bd.group}); got != 0 {
			t.Errorf("ingest_stream_pending = %v, want 0", got)
		}
	})
}

func TestFailTwiceThenSucceed(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		backoff := task.Backoff{Base: 300 * time.Millisecond, Max: 10 * time.Second}
		bd := setup(t, b, task.Config{Backoff: backoff})
		var calls atomic.Int32
		var attempts []int
		var mu sync.Mutex
		w, reg := bd.worker(ingest.Config{ReclaimIdle: 2 * time.Second}, map[string]ingest.Handler{
			"flaky": func(ctx context.Context, tk ingest.Task) error {
				mu.Lock()
				attempts = append(attempts, tk.Attempt)
				mu.Unlock()
				if calls.Add(1) <= 2 {
					return errors.New("flaky failure")
				}
				return nil
			},
		})
		bd.run(w)
		bd.reclaim(w, 2*time.Second)
		id := bd.enqueue("flaky", 1, 5)[0]
		bd.eventually(20*time.Second, "SUCCEEDED", bd.statusIs(id, task.Succeeded))

		tk := bd.task(id)
		if tk.AttemptCount != 2 {
			t.Errorf("attempt_count = %d, want 2", tk.AttemptCount)
		}
		if want, got := "QUEUED→RUNNING→RETRYING→RUNNING→RETRYING→RUNNING→SUCCEEDED", bd.path(id); got != want {
			t.Errorf("transitions %s, want %s", got, want)
		}
		mu.Lock()
		if len(attempts) != 3 || attempts[0] != 1 || attempts[1] != 2 || attempts[2] != 3 {
			t.Errorf("handler saw attempts %v, want [1 2 3]", attempts)
		}
		mu.Unlock()
		// Each retry ran no earlier than its backoff and not a poll or a
		// rescue later: within the backoff plus 10 s (it takes milliseconds
		// more; the reclaim interval here is 20ms).
		recs := bd.transitions(id)
		for i, failed := range []int{2, 4} {
			lo, hi := backoff.Bounds(i + 1)
			gap := recs[failed+1].CreatedAt.Sub(recs[failed].CreatedAt)
			t.Logf("retry %d ran %s after the failure (backoff %s..%s)", i+1, gap.Round(time.Millisecond), lo, hi)
			if gap < lo || gap > hi+10*time.Second {
				t.Errorf("retry %d ran %s after the failure, want between %s and %s", i+1, gap, lo, hi+10*time.Second)
			}
		}
		bd.eventually(5*time.Second, "XPENDING empty", func() bool { return bd.pending() == 0 })
		awaitMetric(t, reg, "ingest_task_process_total", result("retry"), 2)
	})
}

// TestRetryRunsAtItsTimeWithoutAReclaimer: a worker runs its own failed
// task again when its retry falls due, without waiting for a reclaim
// round (here there is no reclaimer at all), and not before its backoff.
func TestRetryRunsAtItsTimeWithoutAReclaimer(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		backoff := task.Backoff{Base: 200 * time.Millisecond, Max: time.Second}
		bd := setup(t, b, task.Config{Backoff: backoff})
		var calls atomic.Int32
		w, reg := bd.worker(ingest.Config{}, map[string]ingest.Handler{
			"flaky": func(ctx context.Context, tk ingest.Task) error {
				if calls.Add(1) <= 2 {
					return errors.New("flaky failure")
				}
				return nil
			},
		})
		bd.run(w)
		id := bd.enqueue("flaky", 1, 5)[0]
		bd.eventually(20*time.Second, "SUCCEEDED", bd.statusIs(id, task.Succeeded))
		if want, got := "QUEUED→RUNNING→RETRYING→RUNNING→RETRYING→RUNNING→SUCCEEDED", bd.path(id); got != want {
			t.Errorf("transitions %s, want %s", got, want)
		}
		recs := bd.transitions(id)
		for i, failed := range []int{2, 4} {
			lo, _ := backoff.Bounds(i + 1)
			if gap := recs[failed+1].CreatedAt.Sub(recs[failed].CreatedAt); gap < lo {
				t.Errorf("retry %d ran %s after the failure, before its backoff %s", i+1, gap, lo)
			}
		}
		bd.eventually(5*time.Second, "XPENDING empty", func() bool { return bd.pending() == 0 })
		awaitMetric(t, reg, "ingest_task_process_total", result("retry"), 2)
	})
}

func TestAlwaysFailingGoesDead(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{Backoff: fastBackoff})
		var calls atomic.Int32
		w, reg := bd.worker(ingest.Config{ReclaimIdle: time.Second}, map[string]ingest.Handler{
			"doomed": func(ctx context.Context, tk ingest.Task) error {
				calls.Add(1)
				return errors.New("upstream said no")
			},
		})
		bd.run(w)
		bd.reclaim(w, time.Second)
		id := bd.enqueue("doomed", 1, 3)[0]
		source := bd.pendingOrRead(id)
		bd.eventually(15*time.Second, "DEAD", bd.statusIs(id, task.Dead))
		bd.eventually(5*time.Second, "one DLQ entry, source acked", func() bool { return len(bd.dlqEntries()) == 1 && bd.pending() == 0 })

		tk := bd.task(id)
		if tk.AttemptCount != 3 || calls.Load() != 3 {
			t.Errorf("attempt_count %d, handler calls %d; want 3 and 3", tk.AttemptCount, calls.Load())
		}
		e := bd.dlqEntries()[0].Values
		want := map[string]string{"task_id": id.String(), "kind": "doomed", "attempt_count": "3",
			"last_error": "upstream said no", "source_id": source}
		for k, v := range want {
			if e[k] != v {
				t.Errorf("DLQ field %s = %q, want %q", k, e[k], v)
			}
		}
		deadAt, err := time.Parse(time.RFC3339, e["dead_at"].(string))
		if err != nil || time.Since(deadAt) > time.Minute {
			t.Errorf("DLQ dead_at %q: %v", e["dead_at"], err)
		}
		if len(e) != 6 {
			t.Errorf("DLQ entry has fields %v, want exactly the 6 of docs/ARCHITECTURE.md §4.3", e)
		}
		awaitMetric(t, reg, "ingest_task_dlq_total", nil, 1)
		awaitMetric(t, reg, "ingest_task_process_total", result("dead"), 1)
	})
}

// pendingOrRead returns the stream entry id of a task's entry.
func (bd *bundle) pendingOrRead(id uuid.UUID) string {
	bd.t.Helper()
	msgs, err := bd.rdb.XRange(bd.ctx, bd.stream, "-", "+").Result()
	if err != nil {
		bd.t.Fatal(err)
	}
	for _, m := range msgs {
		if m.Values["task_id"] == id.String() {
			return m.ID
		}
	}
	bd.t.Fatalf("no entry for task %s", id)
	return ""
}

func TestPermanentErrorDeadAfterOneAttempt(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{Backoff: fastBackoff})
		var calls atomic.Int32
		w, _ := bd.worker(ingest.Config{}, map[string]ingest.Handler{
			"strict": func(ctx context.Context, tk ingest.Task) error {
				calls.Add(1)
				return ingest.Permanent(errors.New("invalid payload"))
			},
		})
		bd.run(w)
		id := bd.enqueue("strict", 1, 10)[0]
		bd.eventually(10*time.Second, "DEAD + DLQ", func() bool { return len(bd.dlqEntries()) == 1 && bd.pending() == 0 })
		tk := bd.task(id)
		if tk.Status != task.Dead || tk.AttemptCount != 1 || calls.Load() != 1 {
			t.Errorf("status %s attempt_count %d calls %d; want DEAD, 1, 1", tk.Status, tk.AttemptCount, calls.Load())
		}
		if want, got := "QUEUED→RUNNING→DEAD", bd.path(id); got != want {
			t.Errorf("transitions %s, want %s", got, want)
		}
	})
}

func TestDuplicateDeliveriesRunOnce(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		calls := map[uuid.UUID]*atomic.Int32{}
		var mu sync.Mutex
		gate := make(chan struct{})
		w, reg := bd.worker(ingest.Config{}, map[string]ingest.Handler{
			"once": func(ctx context.Context, tk ingest.Task) error {
				mu.Lock()
				c := calls[tk.ID]
				mu.Unlock()
				c.Add(1)
				<-gate
				return nil
			},
		})
		// Two entries for one task, read in one batch.
		ids := bd.enqueue("once", 2, 0)
		a, bTask := ids[0], ids[1]
		for _, id := range ids {
			calls[id] = &atomic.Int32{}
		}
		bd.add(onceEntry(a))
		bd.run(w)
		bd.eventually(5*time.Second, "both handlers running", func() bool { return calls[a].Load() == 1 && calls[bTask].Load() == 1 })

		// The entry of b delivered again while b runs (as a reclaim would),
		// and a second entry for b read by the consumer.
		srcB := bd.pendingOrRead(bTask)
		msgs, err := bd.rdb.XRangeN(bd.ctx, bd.stream, srcB, srcB, 1).Result()
		if err != nil || len(msgs) != 1 {
			t.Fatalf("xrange: %v %v", msgs, err)
		}
		sink := w.Sink()
		sink.Process(bd.ctx, msgs, sink.Reserve(1))
		bd.add(onceEntry(bTask))
		// Both duplicate entries (a's second, b's second) are acked as
		// skipped while the originals still run.
		bd.eventually(5*time.Second, "duplicates skipped", func() bool {
			return metric(t, reg, "ingest_task_process_total", result("skipped")) == 2
		})
		close(gate)
		bd.eventually(5*time.Second, "SUCCEEDED, nothing pending", func() bool {
			return bd.countStatus(task.Succeeded) == 2 && bd.pending() == 0
		})
		// The same entry once more after the task finished: acked, not run.
		// The worker forgets an entry just after its XACK; a delivery in
		// between is ignored as one of an entry it still handles (logged),
		// so the entry is delivered again after each such ignore.
		const ignored = "entry delivered again while handled here"
		seen := bd.logs.count(ignored)
		sink.Process(bd.ctx, msgs, sink.Reserve(1))
		bd.eventually(5*time.Second, "late duplicate skipped", func() bool {
			if n := bd.logs.count(ignored); n > seen {
				seen = n
				sink.Process(bd.ctx, msgs, sink.Reserve(1))
			}
			return metric(t, reg, "ingest_task_process_total", result("skipped")) == 3
		})
		for id, c := range calls {
			if c.Load() != 1 {
				t.Errorf("task %s ran %d times, want 1", id, c.Load())
			}
			if got := bd.path(id); got != "QUEUED→RUNNING→SUCCEEDED" {
				t.Errorf("task %s transitions %s", id, got)
			}
		}
		if bd.pending() != 0 {
			t.Errorf("pending %v", bd.pendingIDs())
		}
	})
}

func onceEntry(id uuid.UUID) stream.Entry { return stream.Entry{TaskID: id, Kind: "once"} }

func TestPoisonEntries(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		before := bd.enqueue("noop", 5, 0)
		many := []any{"task_id", uuid.NewString()}
		for i := 0; i < 999; i++ {
			many = append(many, "f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+uuid.NewString()[:4], "v")
		}
		poison := map[string][]any{
			"missing task_id": {"kind", "noop"},
			"unknown task":    {"task_id", uuid.NewString(), "kind", "noop"},
			"not a uuid":      {"task_id", "not-a-uuid", "kind", "noop"},
			"binary garbage":  {"task_id", "\xff\xfe\x00garbage", "kind", "\x00\x01\x02"},
			"huge value":      {"task_id", strings.Repeat("a", 100_000), "kind", "noop"},
			"nil uuid":        {"task_id", uuid.Nil.String()},
			"braced uuid":     {"task_id", "{" + uuid.NewString() + "}"},
			"1000 fields":     many,
		}
		sources := map[string]string{}
		for name, vals := range poison {
			id, err := bd.rdb.XAdd(bd.ctx, &redis.XAddArgs{Stream: bd.stream, Values: vals}).Result()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sources[id] = name
		}
		after := bd.enqueue("noop", 5, 0)
		w, reg := bd.worker(ingest.Config{}, map[string]ingest.Handler{"noop": noop})
		bd.run(w)
		bd.eventually(10*time.Second, "all poison dead-lettered, valid tasks done", func() bool {
			return len(bd.dlqEntries()) == len(poison) && bd.countStatus(task.Succeeded) == 10 && bd.pending() == 0
		})
		for _, e := range bd.dlqEntries() {
			src, _ := e.Values["source_id"].(string)
			name, ok := sources[src]
			if !ok {
				t.Errorf("DLQ entry %v is for no poison entry", e.Values)
				continue
			}
			delete(sources, src)
			reason, _ := e.Values["last_error"].(string)
			if !(strings.Contains(reason, "poison entry") || strings.Contains(reason, "unknown task")) || len(reason) > 1000 {
				t.Errorf("%s: reason %q", name, reason)
			}
			t.Logf("%s: %s", name, reason)
		}
		if len(sources) != 0 {
			t.Errorf("not dead-lettered: %v", sources)
		}
		for _, id := range append(before, after...) {
			if s := bd.task(id).Status; s != task.Succeeded {
				t.Errorf("valid task %s is %s", id, s)
			}
		}
		awaitMetric(t, reg, "ingest_task_dlq_total", nil, float64(len(poison)))
	})
}

func TestDLQWrongTypeKeepsEntryPending(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		if err := bd.rdb.Set(bd.ctx, bd.dlq, "not a stream", 0).Err(); err != nil {
			t.Fatal(err)
		}
		w, reg := bd.worker(ingest.Config{TaskLease: 300 * time.Millisecond, ReclaimIdle: time.Second}, map[string]ingest.Handler{
			"strict": func(context.Context, ingest.Task) error { return ingest.Permanent(errors.New("no")) },
		})
		bd.run(w)
		bd.reclaim(w, time.Second) // must not take the held entry away
		id := bd.enqueue("strict", 1, 3)[0]
		bd.eventually(10*time.Second, "DEAD with a failed DLQ write", func() bool {
			return bd.task(id).Status == task.Dead && bd.logs.count("dead-letter failed") == 1
		})
		if p := bd.pending(); p != 1 {
			t.Fatalf("pending = %d after the failed DLQ write, want 1 (the entry must not be lost)", p)
		}
		// Held past the reclaim idle time: the heartbeat keeps it fresh.
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if p := bd.pending(); p != 1 {
				t.Fatalf("pending = %d while the DLQ is broken, want 1", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := bd.rdb.Del(bd.ctx, bd.dlq).Err(); err != nil {
			t.Fatal(err)
		}
		bd.eventually(10*time.Second, "dead-lettered after the fix", func() bool { return bd.pending() == 0 })
		entries := bd.dlqEntries()
		if len(entries) != 1 || entries[0].Values["task_id"] != id.String() {
			t.Fatalf("DLQ = %v, want one entry for %s", entries, id)
		}
		awaitMetric(t, reg, "ingest_task_dlq_total", nil, 1)
	})
}

func TestStreamDeletedGroupRecreated(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		w, _ := bd.worker(ingest.Config{Concurrency: 4}, map[string]ingest.Handler{
			"slowish": func(ctx context.Context, _ ingest.Task) error {
				time.Sleep(5 * time.Millisecond)
				return nil
			},
		})
		bd.run(w)
		bd.enqueue("slowish", 40, 0)
		bd.eventually(10*time.Second, "some done", func() bool { return bd.countStatus(task.Succeeded) >= 5 })
		if err := bd.rdb.Del(bd.ctx, bd.stream).Err(); err != nil {
			t.Fatal(err)
		}
		later := bd.enqueue("slowish", 10, 0)
		bd.eventually(15*time.Second, "tasks added after the DEL done", func() bool {
			for _, id := range later {
				if bd.task(id).Status != task.Succeeded {
					return false
				}
			}
			return true
		})
		bd.eventually(5*time.Second, "nothing pending", func() bool { return bd.pending() == 0 })
		if bd.logs.count("consumer group missing") == 0 {
			t.Errorf("the group was not recreated (no log line)")
		}
	})
}

func TestShutdownReleasesUnfinished(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		started := make(chan uuid.UUID, 10)
		// A grace period of 5 s: the quick runs' 200 ms and their success
		// commits fit in it on a slow machine; the stuck ones are cut off.
		w1, reg1 := bd.worker(ingest.Config{Concurrency: 8, ShutdownTimeout: 5 * time.Second}, map[string]ingest.Handler{
			"quick": func(ctx context.Context, tk ingest.Task) error {
				started <- tk.ID
				time.Sleep(200 * time.Millisecond) // finishes within the grace period
				return nil
			},
			"stuck": func(ctx context.Context, tk ingest.Task) error {
				started <- tk.ID
				<-ctx.Done()
				return ctx.Err()
			},
		})
		stop1 := bd.run(w1)
		quick := bd.enqueue("quick", 2, 3)
		stuck := bd.enqueue("stuck", 3, 3)
		for range 5 {
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("handlers did not start")
			}
		}
		stop1()

		for _, id := range quick {
			if s := bd.task(id).Status; s != task.Succeeded {
				t.Errorf("quick task %s is %s after shutdown, want SUCCEEDED", id, s)
			}
		}
		stuckSources := map[string]bool{}
		for _, id := range stuck {
			tk := bd.task(id)
			if tk.Status != task.Retrying || tk.AttemptCount != 0 {
				t.Errorf("stuck task %s: %s attempt_count %d, want RETRYING 0 (released, not failed)", id, tk.Status, tk.AttemptCount)
			}
			stuckSources[bd.pendingOrRead(id)] = true
		}
		pend := bd.pendingIDs()
		if len(pend) != 3 {
			t.Fatalf("pending %v after shutdown, want the 3 unfinished entries", pend)
		}
		for _, p := range pend {
			if !stuckSources[p] {
				t.Errorf("pending entry %s is not an unfinished task's", p)
			}
		}
		awaitMetric(t, reg1, "ingest_task_process_total", result("released"), 3)

		// A second worker finishes them: their entries are claimable at once.
		var ran atomic.Int32
		w2, _ := bd.worker(ingest.Config{}, map[string]ingest.Handler{
			"stuck": func(context.Context, ingest.Task) error { ran.Add(1); return nil },
		})
		bd.run(w2)
		bd.reclaim(w2, w2.Config().ReclaimIdle)
		bd.eventually(10*time.Second, "finished on the second worker", func() bool {
			return bd.countStatus(task.Succeeded) == 5 && bd.pending() == 0
		})
		if ran.Load() != 3 {
			t.Errorf("second worker ran %d tasks, want 3", ran.Load())
		}
		for _, id := range stuck {
			if want, got := "QUEUED→RUNNING→RETRYING→RUNNING→SUCCEEDED", bd.path(id); got != want {
				t.Errorf("transitions %s, want %s", got, want)
			}
		}
	})
}

func TestPanicIsAFailure(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		w, _ := bd.worker(ingest.Config{}, map[string]ingest.Handler{
			"explode": func(context.Context, ingest.Task) error { panic("boom") },
			"noop":    noop,
		})
		bd.run(w)
		id := bd.enqueue("explode", 1, 1)[0]
		bd.eventually(10*time.Second, "DEAD", bd.statusIs(id, task.Dead))
		msg := bd.task(id).LastError
		if !strings.HasPrefix(msg, "panic: boom") || !strings.Contains(msg, "TestPanicIsAFailure") || len(msg) > 3000 {
			t.Errorf("last_error %q: want the panic message and a short stack", msg)
		}
		ok := bd.enqueue("noop", 3, 0)
		bd.eventually(10*time.Second, "worker still running", func() bool { return bd.countStatus(task.Succeeded) == len(ok) })
	})
}

// TestGoexitIsAFailure: a handler that ends its goroutine with
// runtime.Goexit (as t.FailNow does) has a failed attempt saying so, and
// gives its slot back; it was never recorded before, its task held
// RUNNING by a lease renewed for ever.
func TestGoexitIsAFailure(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		w, _ := bd.worker(ingest.Config{Concurrency: 1}, map[string]ingest.Handler{
			"leave": func(context.Context, ingest.Task) error { runtime.Goexit(); return nil },
			"noop":  noop,
		})
		bd.run(w)
		id := bd.enqueue("leave", 1, 1)[0]
		bd.eventually(10*time.Second, "DEAD", bd.statusIs(id, task.Dead))
		if msg := bd.task(id).LastError; !strings.Contains(msg, "runtime.Goexit") {
			t.Errorf("last_error %q: want it to name runtime.Goexit", msg)
		}
		ok := bd.enqueue("noop", 3, 0)
		bd.eventually(10*time.Second, "the slot given back", func() bool { return bd.countStatus(task.Succeeded) == len(ok) })
	})
}

func TestUnknownKindFailsNamingIt(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{Backoff: fastBackoff})
		w, _ := bd.worker(ingest.Config{ReclaimIdle: time.Second}, nil)
		bd.run(w)
		id := bd.enqueue("mystery-kind", 1, 5)[0]
		bd.eventually(10*time.Second, "RETRYING", bd.statusIs(id, task.Retrying))
		if msg := bd.task(id).LastError; !strings.Contains(msg, `"mystery-kind"`) {
			t.Errorf("last_error %q does not name the kind", msg)
		}
		// Registered later (a new deploy): the retry succeeds.
		w.Handle("mystery-kind", noop)
		bd.reclaim(w, time.Second)
		bd.eventually(10*time.Second, "SUCCEEDED", bd.statusIs(id, task.Succeeded))
	})
}

func TestLongTaskRunsOnce(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		const idle = 500 * time.Millisecond
		var calls atomic.Int32
		h := map[string]ingest.Handler{"long": func(ctx context.Context, _ ingest.Task) error {
			calls.Add(1)
			select {
			case <-time.After(10 * idle):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}
		cfg := ingest.Config{TaskLease: 450 * time.Millisecond, ReclaimIdle: idle}
		w1, _ := bd.worker(cfg, h)
		w2, _ := bd.worker(cfg, h) // an eager second worker reclaiming idle entries
		bd.run(w1)
		bd.run(w2)
		bd.reclaim(w1, idle)
		bd.reclaim(w2, idle)
		id := bd.enqueue("long", 1, 3)[0]
		bd.eventually(20*time.Second, "SUCCEEDED", bd.statusIs(id, task.Succeeded))
		if calls.Load() != 1 {
			t.Errorf("ran %d times, want 1", calls.Load())
		}
		if want, got := "QUEUED→RUNNING→SUCCEEDED", bd.path(id); got != want {
			t.Errorf("transitions %s, want %s", got, want)
		}
		bd.eventually(5*time.Second, "nothing pending", func() bool { return bd.pending() == 0 })
	})
}

func TestLeaseLostIsAConflict(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{})
		running := make(chan struct{}, 1)
		cancelled := make(chan error, 1)
		w, reg := bd.worker(ingest.Config{TaskLease: 300 * time.Millisecond}, map[string]ingest.Handler{
			"victim": func(ctx context.Context, _ ingest.Task) error {
				running <- struct{}{}
				<-ctx.Done()
				cancelled <- ctx.Err()
				return ctx.Err()
			},
		})
		bd.run(w)
		id := bd.enqueue("victim", 1, 3)[0]
		<-running
		// Another worker took the task over (as after an expired lease).
		if _, err := bd.db.Exec(bd.ctx, `UPDATE ingest_task SET lease_owner = 'thief', lease_until = now() + interval '1 hour' WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-cancelled:
		case <-time.After(10 * time.Second):
			t.Fatal("handler context not cancelled after the lease was lost")
		}
		bd.eventually(5*time.Second, "conflict counted", func() bool {
			return metric(t, reg, "ingest_task_process_total", result("conflict")) == 1
		})
		if n := bd.logs.count("lease lost; cancelling"); n != 1 {
			t.Errorf("lease-lost log lines: %d, want 1", n)
		}
		if n := bd.logs.count("outcome not recorded: lease lost"); n != 1 {
			t.Errorf("conflict log lines: %d, want 1", n)
		}
		if tk := bd.task(id); tk.Status != task.Running || tk.LeaseOwner != "thief" || tk.AttemptCount != 0 {
			t.Errorf("task changed: %s %s %d", tk.Status, tk.LeaseOwner, tk.AttemptCount)
		}
		if bd.pending() != 1 {
			t.Errorf("the entry was acked; it belongs to the new lease holder")
		}
	})
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	store, err := task.NewStore(task.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, tc := range []struct {
		cfg   ingest.Config
		field string
	}{
		{ingest.Config{Concurrency: -1}, "Concurrency"},
		{ingest.Config{TaskLease: time.Millisecond}, "TaskLease"},
		{ingest.Config{TaskTimeout: -time.Second}, "TaskTimeout"},
		{ingest.Config{ShutdownTimeout: -time.Second}, "ShutdownTimeout"},
		{ingest.Config{ReclaimIdle: time.Microsecond}, "ReclaimIdle"},
		{ingest.Config{Stream: "s", DLQ: "s"}, "DLQ"},
		{ingest.Config{Block: -time.Second}, "Block"},
	} {
		_, err := ingest.New(tc.cfg, store, rdb, nil, nil)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: error %v, want one naming %s", tc.cfg, err, tc.field)
		}
	}
	w, err := ingest.New(ingest.Config{NoDLQ: true}, store, rdb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := w.Config()
	if c.DLQ != "" || c.Stream != "ingest:tasks" || c.Group != "ingest-workers" || c.Concurrency != 16 ||
		c.TaskLease != 30*time.Second || c.ReclaimIdle != 10*time.Minute || c.Consumer == "" {
		t.Errorf("defaults: %+v", c)
	}
	if _, err := dlq.NewWriter(dlq.Config{}, rdb); err == nil {
		t.Error("dlq.NewWriter accepted an empty config")
	}
}
