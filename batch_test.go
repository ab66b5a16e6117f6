package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

func TestBatchOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts ingest.BatchOptions
		want string // "" valid, else the field named
	}{
		{ingest.BatchOptions{Max: 1}, ""},
		{ingest.BatchOptions{Max: ingest.MaxBatchSize, Wait: ingest.MaxBatchWait, Timeout: time.Hour}, ""},
		{ingest.BatchOptions{Max: 0}, "BatchOptions.Max"},
		{ingest.BatchOptions{Max: ingest.MaxBatchSize + 1}, "BatchOptions.Max"},
		{ingest.BatchOptions{Max: 2, Wait: -time.Millisecond}, "BatchOptions.Wait"},
		{ingest.BatchOptions{Max: 2, Wait: ingest.MaxBatchWait + 1}, "BatchOptions.Wait"},
		{ingest.BatchOptions{Max: 2, Timeout: -1}, "BatchOptions.Timeout"},
	} {
		err := tc.opts.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.opts, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error naming %s", tc.opts, err, tc.want)
		}
	}
}

// TestHandleBatchRefusesBadArguments: a bad option or a nil handler is an
// error naming it, and registers nothing.
func TestHandleBatchRefusesBadArguments(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	fn := func(context.Context, []ingest.Task) ([]ingest.Outcome, error) { return nil, nil }
	if err := svc.HandleBatch("k", fn, ingest.BatchOptions{Max: 0}); err == nil || !strings.Contains(err.Error(), "BatchOptions.Max") {
		t.Errorf("Max 0: %v, want an error naming BatchOptions.Max", err)
	}
	if err := svc.HandleBatch("k", nil, ingest.BatchOptions{Max: 2}); err == nil || !strings.Contains(err.Error(), "nil handler") {
		t.Errorf("nil handler: %v", err)
	}
	if err := svc.HandleBatch("", fn, ingest.BatchOptions{Max: 2}); err == nil || !strings.Contains(err.Error(), "kind") {
		t.Errorf("empty kind: %v", err)
	}
	if err := svc.HandleDefaultBatch(fn, ingest.BatchOptions{Max: 2, Timeout: time.Second}); err == nil || !strings.Contains(err.Error(), "BatchOptions.Timeout") {
		t.Errorf("default with a timeout: %v, want an error naming BatchOptions.Timeout", err)
	}
}

// mode is what the test handlers do with a task, by its payload's "mode"
// and its attempt: the same decision whether the task runs alone or in a
// batch.
func decide(t ingest.Task) (result any, err error, omit bool) {
	var p struct {
		Mode string `json:"mode"`
		N    int    `json:"n"`
	}
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return nil, ingest.Permanent(err), false
	}
	switch p.Mode {
	case "ok":
		return map[string]int{"n": p.N}, nil, false
	case "flaky": // fails its first attempt
		if t.Attempt == 1 {
			return nil, errors.New("flaky"), false
		}
		return map[string]int{"n": p.N}, nil, false
	case "later": // asks for a delayed retry once
		if t.Attempt == 1 {
			return nil, ingest.RetryAfter(50*time.Millisecond, errors.New("later")), false
		}
		return nil, nil, false
	case "permanent":
		return nil, ingest.Permanent(errors.New("bad input")), false
	case "exhaust": // fails every attempt
		return nil, errors.New("always"), false
	case "missing": // no outcome on its first attempt
		if t.Attempt == 1 {
			return nil, nil, true
		}
		return "second", nil, false
	case "big": // a result over the limit on its first attempt
		if t.Attempt == 1 {
			return json.RawMessage(`"` + strings.Repeat("x", 2000) + `"`), nil, false
		}
		return nil, nil, false
	}
	return nil, ingest.Permanent(fmt.Errorf("unknown mode %q", p.Mode)), false
}

var modes = []string{"ok", "flaky", "later", "permanent", "exhaust", "missing", "big"}

// trail renders a task's audit trail: each transition's target state and
// attempt count.
func trail(t *testing.T, pool *pgxpool.Pool, id uuid.UUID) string {
	t.Helper()
	recs, err := transition.List(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, r := range recs {
		parts = append(parts, fmt.Sprintf("%s/%d", r.To, r.AttemptCount))
	}
	return strings.Join(parts, "→")
}

// batchLog records the batches a batch handler was given.
type batchLog struct {
	mu      sync.Mutex
	batches [][]uuid.UUID
}

func (l *batchLog) add(tasks []ingest.Task) {
	ids := make([]uuid.UUID, len(tasks))
	for i, t := range tasks {
		ids[i] = t.ID
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, ids)
}

func (l *batchLog) sizes() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s []int
	for _, b := range l.batches {
		s = append(s, len(b))
	}
	return s
}

// runs counts how often each task was handed to the handler.
func (l *batchLog) runs() map[uuid.UUID]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[uuid.UUID]int{}
	for _, b := range l.batches {
		for _, id := range b {
			n[id]++
		}
	}
	return n
}

// create creates one task of kind per payload, in one batch, with
// maxAttempts.
func (b *serviceBundle) create(kind string, maxAttempts int, payloads ...string) []uuid.UUID {
	b.t.Helper()
	nts := make([]task.NewTask, len(payloads))
	for i, p := range payloads {
		nts[i] = task.NewTask{Kind: kind, Payload: json.RawMessage(p), MaxAttempts: maxAttempts}
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

// waitEnd waits for task id to end and returns it.
func waitEnd(t *testing.T, svc *ingest.Service, id uuid.UUID) task.Task {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := svc.Wait(ctx, id)
	if err != nil {
		t.Fatalf("wait for %s: %v (status %s)", id, err, got.Status)
	}
	return got
}

// TestBatchHandlerMixedOutcomes runs the same tasks once under a Handler
// and once under a batch handler that decides the same: every task's
// audit trail (states and attempt counts), end state and result are the
// same either way, batches never exceed Max, and the DLQ gets the same
// deaths.
func TestBatchHandlerMixedOutcomes(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	cfg := b.store.Config()
	cfg.MaxResultBytes = 1000
	store, err := task.NewStore(cfg, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	b.store = store
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	svc.HandleResult("single", func(ctx context.Context, t ingest.Task) (json.RawMessage, error) {
		res, err, omit := decide(t)
		if omit {
			return nil, errors.New("no outcome")
		}
		if err != nil {
			return nil, err
		}
		return json.Marshal(res)
	})
	const max = 4
	var log batchLog
	if err := svc.HandleBatch("batched", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		log.add(tasks)
		var outs []ingest.Outcome
		for _, t := range tasks {
			res, err, omit := decide(t)
			if !omit {
				outs = append(outs, t.Outcome(res, err))
			}
		}
		return outs, nil
	}, ingest.BatchOptions{Max: max, Wait: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var payloads []string
	for i := range 2 {
		for _, m := range modes {
			payloads = append(payloads, fmt.Sprintf(`{"mode":%q,"n":%d}`, m, i))
		}
	}
	alone := b.create("single", 2, payloads...)
	batched := b.create("batched", 2, payloads...)
	for i, p := range payloads {
		a, bt := waitEnd(t, svc, alone[i]), waitEnd(t, svc, batched[i])
		ta, tb := trail(t, b.db.Pool, a.ID), trail(t, b.db.Pool, bt.ID)
		if ta != tb {
			t.Errorf("%s: audit trail alone %s, in a batch %s", p, ta, tb)
		}
		if a.Status != bt.Status || a.AttemptCount != bt.AttemptCount || string(a.Result) != string(bt.Result) {
			t.Errorf("%s: alone %s (attempts %d, result %s), in a batch %s (attempts %d, result %s)",
				p, a.Status, a.AttemptCount, a.Result, bt.Status, bt.AttemptCount, bt.Result)
		}
		if strings.Contains(p, `"missing"`) {
			recs, err := transition.List(context.Background(), b.db.Pool, bt.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(recs, func(r transition.Record) bool {
				return strings.Contains(r.Message, "batch handler returned no outcome for task "+bt.ID.String())
			}) {
				t.Errorf("%s: no audit row says the batch handler returned no outcome", p)
			}
		}
	}
	sizes := log.sizes()
	if slices.Max(sizes) > max || slices.Max(sizes) < 2 {
		t.Errorf("batch sizes %v: want at most %d, and some batch of more than one", sizes, max)
	}
	for id, n := range log.runs() {
		got := waitEnd(t, svc, id)
		if want := got.AttemptCount + 1; got.Status == task.Succeeded && n != want {
			t.Errorf("task %s ran %d times, want %d", id, n, want)
		}
	}
	// A DEAD task's entry is written after its DEAD commits, with the
	// acknowledgement of its stream entry: nothing pending, every entry
	// written.
	b.eventually(30*time.Second, "nothing pending", func() bool {
		p, err := b.rdb.XPending(context.Background(), b.stream, ingest.DefaultGroup).Result()
		return err == nil && p.Count == 0
	})
	dead := map[string]int{}
	msgs, err := b.rdb.XRange(context.Background(), b.dlq, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		dead[fmt.Sprint(m.Values["kind"])]++
	}
	if dead["single"] != dead["batched"] || dead["batched"] == 0 {
		t.Errorf("DLQ entries by kind %v, want the same non-zero count for single and batched", dead)
	}
}

// TestBatchHandlerPanicFailsTheBatch: a batch handler that panics fails
// every task of its batch as an attempt, saying so; the tasks run again
// and the worker carries on.
func TestBatchHandlerPanicFailsTheBatch(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	var log batchLog
	var once sync.Once
	if err := svc.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		log.add(tasks)
		once.Do(func() { panic("boom") })
		outs := make([]ingest.Outcome, len(tasks))
		for i, t := range tasks {
			outs[i] = t.Outcome(nil, nil)
		}
		return outs, nil
	}, ingest.BatchOptions{Max: 3, Wait: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ids := b.create("k", 3, `{}`, `{}`, `{}`)
	for _, id := range ids {
		if got := waitEnd(t, svc, id); got.Status != task.Succeeded {
			t.Fatalf("%s ended %s", id, got.Status)
		}
	}
	log.mu.Lock()
	first := log.batches[0]
	log.mu.Unlock()
	for _, id := range first {
		if got, want := trail(t, b.db.Pool, id), "QUEUED/0→RUNNING/0→RETRYING/1→RUNNING/1→SUCCEEDED/1"; got != want {
			t.Errorf("task %s of the panicking batch: %s, want %s", id, got, want)
		}
		recs, err := transition.List(context.Background(), b.db.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(recs[2].Message, "batch handler panic: boom") {
			t.Errorf("task %s: retry message %q, want the panic", id, recs[2].Message)
		}
	}
}

// TestBatchHandlerMaxAndWait: a burst is handed over in batches of at most
// Max, the full ones at once; a lone task is handed over alone once Wait
// has passed.
func TestBatchHandlerMaxAndWait(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	const wait = 500 * time.Millisecond
	var log batchLog
	handedAt := make(chan time.Time, 100)
	if err := svc.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		handedAt <- time.Now()
		log.add(tasks)
		outs := make([]ingest.Outcome, len(tasks))
		for i, t := range tasks {
			outs[i] = t.Outcome(len(tasks), nil)
		}
		return outs, nil
	}, ingest.BatchOptions{Max: 10, Wait: wait}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	lone := b.create("k", 1, `{}`)
	if got := waitEnd(t, svc, lone[0]); got.Status != task.Succeeded || string(got.Result) != "1" {
		t.Fatalf("lone task: %s, result %s; want SUCCEEDED in a batch of 1", got.Status, got.Result)
	}
	if d := (<-handedAt).Sub(created); d < wait {
		t.Errorf("the lone task was handed over %s after its creation, before Wait (%s) passed", d, wait)
	}
	payloads := make([]string, 25)
	for i := range payloads {
		payloads[i] = `{}`
	}
	ids := b.create("k", 1, payloads...)
	for _, id := range ids {
		if got := waitEnd(t, svc, id); got.Status != task.Succeeded {
			t.Fatalf("%s ended %s", id, got.Status)
		}
	}
	sizes := log.sizes()[1:]
	total := 0
	for _, s := range sizes {
		total += s
		if s > 10 {
			t.Errorf("a batch of %d tasks, Max is 10 (sizes %v)", s, sizes)
		}
	}
	if total != 25 {
		t.Errorf("batches %v hold %d tasks, want 25 (each once)", sizes, total)
	}
	t.Logf("burst of 25, Max 10: batch sizes %v", sizes)
}

// TestBatchHandlerLeaseRenewal: the leases of a batch's tasks are renewed
// while the batch runs for many leases (the worker's own reclaimer would
// take an expired one over); no task is taken over, each runs once and
// succeeds.
func TestBatchHandlerLeaseRenewal(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	cfg := b.fastConfig("w1") // TaskLease 1s, ReclaimIdle 500ms
	svc := b.run(cfg, nil, slog.LevelError)
	started := make(chan []uuid.UUID, 1)
	release := make(chan struct{})
	var log batchLog
	if err := svc.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		log.add(tasks)
		ids := make([]uuid.UUID, len(tasks))
		for i, t := range tasks {
			ids[i] = t.ID
		}
		started <- ids
		<-release
		outs := make([]ingest.Outcome, len(tasks))
		for i, t := range tasks {
			outs[i] = t.Outcome(nil, nil)
		}
		return outs, nil
	}, ingest.BatchOptions{Max: 3, Wait: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ids := b.create("k", 5, `{}`, `{}`, `{}`)
	var batch []uuid.UUID
	select {
	case batch = <-started:
	case <-time.After(time.Minute):
		t.Fatal("no batch started")
	}
	first := map[uuid.UUID]time.Time{}
	for _, id := range batch {
		got, err := b.store.Get(context.Background(), id)
		if err != nil || got.LeaseUntil == nil {
			t.Fatalf("task %s: %v, lease %v", id, err, got.LeaseUntil)
		}
		first[id] = *got.LeaseUntil
	}
	// Three leases past the first one's end: renewed several times.
	b.eventually(30*time.Second, "the batch's leases renewed past three leases", func() bool {
		for _, id := range batch {
			got, err := b.store.Get(context.Background(), id)
			if err != nil || got.Status != task.Running || got.LeaseUntil == nil || !got.LeaseUntil.After(first[id].Add(3*cfg.TaskLease)) {
				return false
			}
		}
		return true
	})
	close(release)
	for _, id := range ids {
		if got := waitEnd(t, svc, id); got.Status != task.Succeeded {
			t.Errorf("%s ended %s", id, got.Status)
		}
		if got, want := trail(t, b.db.Pool, id), "QUEUED/0→RUNNING/0→SUCCEEDED/0"; got != want {
			t.Errorf("task %s: %s, want %s", id, got, want)
		}
	}
	for id, n := range log.runs() {
		if n != 1 {
			t.Errorf("task %s was handed to the handler %d times", id, n)
		}
	}
}

// startService runs a Service of cfg on b's servers; stop stops it and
// waits for Run to return.
func (b *serviceBundle) startService(cfg ingest.Config) (svc *ingest.Service, stop func()) {
	b.t.Helper()
	cfg.Store = b.store.Config()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	svc, err := ingest.NewService(cfg, b.db.Pool, ingest.Redis(b.rdb), logger, prometheus.NewRegistry())
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					b.t.Errorf("service %s: %v", cfg.Consumer, err)
				}
			case <-time.After(time.Minute):
				b.t.Errorf("service %s did not stop within a minute", cfg.Consumer)
			}
		})
	}
	b.t.Cleanup(stop)
	return svc, stop
}

// TestBatchHandlerShutdownLosesNothing stops a worker while a batch runs
// (its handler returns when its context ends) and while a batch is still
// filling: every task is handed back (RETRYING, no failure counted) and
// another worker runs it to success.
func TestBatchHandlerShutdownLosesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		max  int
		wait time.Duration
	}{
		{"Running", 3, 100 * time.Millisecond},
		{"Filling", 10, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newServiceBundle(t)
			cfg := b.fastConfig("w1")
			cfg.ShutdownTimeout = 300 * time.Millisecond
			svc, stop := b.startService(cfg)
			var handed batchLog
			if err := svc.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
				handed.add(tasks)
				<-ctx.Done()
				return nil, context.Cause(ctx)
			}, ingest.BatchOptions{Max: tc.max, Wait: tc.wait}); err != nil {
				t.Fatal(err)
			}
			ids := b.create("k", 2, `{}`, `{}`, `{}`)
			b.eventually(30*time.Second, "every task RUNNING", func() bool { return b.count(task.Running) == 3 })
			if tc.name == "Running" {
				b.eventually(30*time.Second, "the batch handed over", func() bool { return len(handed.runs()) == 3 })
			}
			stop()
			if n := len(handed.runs()); tc.name == "Filling" && n != 0 {
				t.Errorf("%d tasks of a filling batch were handed to the handler", n)
			}
			for _, id := range ids {
				got, err := b.store.Get(context.Background(), id)
				if err != nil {
					t.Fatal(err)
				}
				if got.Status != task.Retrying || got.AttemptCount != 0 {
					t.Errorf("task %s after the stop: %s, attempts %d; want RETRYING, 0", id, got.Status, got.AttemptCount)
				}
			}
			svc2, _ := b.startService(b.fastConfig("w2"))
			if err := svc2.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
				outs := make([]ingest.Outcome, len(tasks))
				for i, t := range tasks {
					outs[i] = t.Outcome(nil, nil)
				}
				return outs, nil
			}, ingest.BatchOptions{Max: tc.max, Wait: 100 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if got := waitEnd(t, svc2, id); got.Status != task.Succeeded || got.AttemptCount != 0 {
					t.Errorf("task %s: %s, attempts %d; want SUCCEEDED, 0", id, got.Status, got.AttemptCount)
				}
				if got, want := trail(t, b.db.Pool, id), "QUEUED/0→RUNNING/0→RETRYING/0→RUNNING/0→SUCCEEDED/0"; got != want {
					t.Errorf("task %s: %s, want %s", id, got, want)
				}
			}
		})
	}
}

// TestBatchHandlerCancelAndTimeoutPerTask: an operator's cancel of one
// task of a running batch reaches that task's Context only; it ends
// CANCELLED, the others SUCCEEDED. A task whose own timeout passes in a
// batch fails that attempt as a timeout, as it would alone.
func TestBatchHandlerCancelAndTimeoutPerTask(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	started := make(chan []ingest.Task, 1)
	victimDone := make(chan error, 1)
	if err := svc.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		started <- tasks
		for _, t := range tasks {
			if string(t.Payload) == `{"victim": true}` {
				<-t.Context().Done()
				victimDone <- context.Cause(t.Context())
			}
		}
		if ctx.Err() != nil {
			return nil, errors.New("the batch's context ended with one task cancelled")
		}
		outs := make([]ingest.Outcome, len(tasks))
		for i, t := range tasks {
			outs[i] = t.Outcome("done", nil)
		}
		return outs, nil
	}, ingest.BatchOptions{Max: 3, Wait: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	ids := b.create("k", 3, `{}`, `{"victim": true}`, `{}`)
	victim := ids[1]
	var batch []ingest.Task
	select {
	case batch = <-started:
	case <-time.After(time.Minute):
		t.Fatal("no batch started")
	}
	if len(batch) != 3 {
		t.Fatalf("a batch of %d, want the 3 tasks created together", len(batch))
	}
	if r, err := b.store.Cancel(context.Background(), "api:test", "enough", victim); err != nil || r.Outcome != task.CancelRequested {
		t.Fatalf("cancel: %+v, %v", r, err)
	}
	select {
	case cause := <-victimDone:
		if !errors.Is(cause, ingest.ErrCancelled) {
			t.Errorf("the cancelled task's context cause %v, want ErrCancelled", cause)
		}
	case <-time.After(time.Minute):
		t.Fatal("the cancelled task's context never ended")
	}
	for _, id := range ids {
		want := task.Succeeded
		if id == victim {
			want = task.Cancelled
		}
		if got := waitEnd(t, svc, id); got.Status != want {
			t.Errorf("task %s ended %s, want %s", id, got.Status, want)
		}
	}

	// Timeouts: the kind's 200ms; the handler waits for each task's end.
	if err := svc.HandleBatch("slow", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		outs := make([]ingest.Outcome, len(tasks))
		for i, t := range tasks {
			<-t.Context().Done()
			outs[i] = t.Outcome(nil, t.Context().Err())
		}
		return outs, nil
	}, ingest.BatchOptions{Max: 2, Wait: 50 * time.Millisecond, Timeout: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for _, id := range b.create("slow", 1, `{}`, `{}`) {
		got := waitEnd(t, svc, id)
		if got.Status != task.Dead || !strings.Contains(got.LastError, "task timeout after 200ms") {
			t.Errorf("slow task %s: %s, %q; want DEAD by a timeout", id, got.Status, got.LastError)
		}
	}
}

// TestBatchHandlerOutcomesWithoutTaskIDs: outcomes that name no task of
// the batch (a zero TaskID) leave every task without an outcome: each run
// fails with an error saying how to build them.
func TestBatchHandlerOutcomesWithoutTaskIDs(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	if err := svc.HandleBatch("k", func(ctx context.Context, tasks []ingest.Task) ([]ingest.Outcome, error) {
		return make([]ingest.Outcome, len(tasks)), nil
	}, ingest.BatchOptions{Max: 2, Wait: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for _, id := range b.create("k", 1, `{}`, `{}`) {
		got := waitEnd(t, svc, id)
		if got.Status != task.Dead || !strings.Contains(got.LastError, "batch handler returned no outcome for task "+id.String()) ||
			!strings.Contains(got.LastError, "named tasks not in the batch: build them with Task.Outcome") {
			t.Errorf("task %s: %s, %q; want DEAD naming the missing outcome", id, got.Status, got.LastError)
		}
	}
}
