package task_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/pgtemp"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// batchSpy is the test's database with a record of the statements of every
// batch sent through it (each batch's SQL, joined).
type batchSpy struct {
	*pgxpool.Pool
	mu      sync.Mutex
	batches []string
}

func (s *batchSpy) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	var sqls []string
	for _, q := range b.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	s.mu.Lock()
	s.batches = append(s.batches, strings.Join(sqls, "\n;\n"))
	s.mu.Unlock()
	return s.Pool.SendBatch(ctx, b)
}

func (s *batchSpy) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	s.mu.Lock()
	s.batches = append(s.batches, sql)
	s.mu.Unlock()
	return s.Pool.Exec(ctx, sql, args...)
}

// sent returns the batches sent since the last call.
func (s *batchSpy) sent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.batches
	s.batches = nil
	return out
}

// TestStartUnflushedSendsSettingInItsRoundTrip: StartUnflushed sends
// synchronous_commit off for its own transaction in the batch of the start
// statement (one round trip), Start does not, and both start their task.
func TestStartUnflushedSendsSettingInItsRoundTrip(t *testing.T) {
	t.Parallel()
	spy := &batchSpy{Pool: testenv.DB(t)}
	store, err := task.NewStore(task.Config{}, spy)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ids := createTasks(t, store, 2, 0)
	spy.sent()
	for i, start := range []func(context.Context, string, time.Duration, ...uuid.UUID) ([]task.StartResult, error){store.StartUnflushed, store.Start} {
		res, err := start(ctx, "w1", time.Minute, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if res[0].Outcome != task.Started {
			t.Fatalf("start %d: outcome %s, want STARTED", i, res[0].Outcome)
		}
		sent := spy.sent()
		if len(sent) != 1 {
			t.Fatalf("start %d: %d round trips, want 1: %q", i, len(sent), sent)
		}
		unflushed := strings.Contains(sent[0], "set_config('synchronous_commit', 'off', true)")
		if want := i == 0; unflushed != want {
			t.Errorf("start %d: synchronous_commit off sent = %v, want %v: %s", i, unflushed, want, sent[0])
		}
	}
}

// createTasks creates n tasks of kind "k" (maxAttempts 0: the store's).
func createTasks(t *testing.T, store *task.Store, n, maxAttempts int) []uuid.UUID {
	t.Helper()
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`), MaxAttempts: maxAttempts}
	}
	res, err := store.CreateBatch(context.Background(), nts)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uuid.UUID, n)
	for i, r := range res {
		ids[i] = r.Task.ID
	}
	return ids
}

// crashable is a durable PostgreSQL of the test's own whose WAL writer
// flushes an unflushed commit only every 10 s, so that an immediate stop
// right after such a commit loses it.
type crashable struct {
	srv   *pgtemp.Server
	db    *pgxpool.Pool
	store *task.Store
}

func newCrashable(t *testing.T) *crashable {
	t.Helper()
	srv, err := pgtemp.StartWith(pgtemp.Options{Durable: true, Settings: []string{"wal_writer_delay=10000", "autovacuum=off"}})
	if err != nil {
		t.Skipf("no PostgreSQL binaries: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	db := testenv.NewMigratedDatabase(t, srv).Pool
	store, err := task.NewStore(task.Config{}, db)
	if err != nil {
		t.Fatal(err)
	}
	return &crashable{srv: srv, db: db, store: store}
}

// crash stops the server at once (no flush, no checkpoint: its WAL buffers
// are lost, as in a crash), starts it again (crash recovery) and waits until
// it answers.
func (c *crashable) crash(t *testing.T) {
	t.Helper()
	if err := c.srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "PostgreSQL answering after the crash", func() bool {
		_, err := c.db.Exec(context.Background(), "SELECT 1")
		return err == nil
	})
}

func (c *crashable) get(t *testing.T, id uuid.UUID) task.Task {
	t.Helper()
	tk, err := c.store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// TestCrashAfterUnflushedStartLosesNoTask: a crash of PostgreSQL right
// after an unflushed start leaves the task startable (the start undone:
// QUEUED, its old owner's completion refused) or started (the start kept:
// its owner completes it); either way it is not lost and not finished
// without a recorded run.
func TestCrashAfterUnflushedStartLosesNoTask(t *testing.T) {
	t.Parallel()
	c := newCrashable(t)
	ctx := context.Background()
	id := createTasks(t, c.store, 1, 0)[0]
	res, err := c.store.StartUnflushed(ctx, "w1", time.Minute, id)
	if err != nil || res[0].Outcome != task.Started {
		t.Fatalf("StartUnflushed: %v %v", res, err)
	}
	c.crash(t)
	switch tk := c.get(t, id); tk.Status {
	case task.Queued:
		t.Log("the start was undone by the crash")
		done, err := c.store.Succeed(ctx, "w1", id)
		if err != nil {
			t.Fatal(err)
		}
		if done[0].Applied {
			t.Fatal("the completion of a run whose start the crash undid was recorded")
		}
		res, err := c.store.StartUnflushed(ctx, "w2", time.Minute, id)
		if err != nil || res[0].Outcome != task.Started {
			t.Fatalf("start again after the crash: %v %v", res, err)
		}
		if res[0].Task.AttemptCount != 0 {
			t.Errorf("attempt_count %d after the undone start, want 0", res[0].Task.AttemptCount)
		}
		done, err = c.store.Succeed(ctx, "w2", id)
		if err != nil || !done[0].Applied {
			t.Fatalf("complete the new run: %v %v", done, err)
		}
	case task.Running:
		t.Log("the start was flushed before the crash")
		if tk.LeaseOwner != "w1" {
			t.Fatalf("RUNNING under %q, want w1", tk.LeaseOwner)
		}
		done, err := c.store.Succeed(ctx, "w1", id)
		if err != nil || !done[0].Applied {
			t.Fatalf("complete the kept run: %v %v", done, err)
		}
	default:
		t.Fatalf("status %s after the crash, want QUEUED or RUNNING", tk.Status)
	}
	if tk := c.get(t, id); tk.Status != task.Succeeded {
		t.Fatalf("status %s, want SUCCEEDED", tk.Status)
	}
}

// TestUnflushedTakeoverThatEndsTaskIsFlushed: a takeover by StartUnflushed
// that ends its task (the abandoned run was its last attempt: DEAD), which
// the worker acts on in the queue at once (the DLQ script acknowledges its
// entry), is flushed before StartUnflushed returns: a crash right after
// leaves the task DEAD, not RUNNING under the expired lease without an
// entry.
func TestUnflushedTakeoverThatEndsTaskIsFlushed(t *testing.T) {
	t.Parallel()
	c := newCrashable(t)
	ctx := context.Background()
	id := createTasks(t, c.store, 1, 1)[0]
	if res, err := c.store.Start(ctx, "w1", time.Millisecond, id); err != nil || res[0].Outcome != task.Started {
		t.Fatalf("Start: %v %v", res, err)
	}
	testenv.Eventually(t, time.Minute, "the lease of w1 expired", func() bool {
		var expired bool
		err := c.db.QueryRow(ctx, `SELECT lease_until < now() FROM ingest_task WHERE id = $1`, id).Scan(&expired)
		return err == nil && expired
	})
	res, err := c.store.StartUnflushed(ctx, "w2", time.Minute, id)
	if err != nil || res[0].Outcome != task.DiedOnTakeover {
		t.Fatalf("StartUnflushed: %v %v, want DIED_ON_TAKEOVER", res, err)
	}
	c.crash(t)
	if tk := c.get(t, id); tk.Status != task.Dead {
		t.Fatalf("status %s after the crash, want DEAD", tk.Status)
	}
}
