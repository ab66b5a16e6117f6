package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// TestRelayPublishesOnNotify checks that a commit is published because
// its NOTIFY woke the relay, not by the relay's periodic pass: the pass
// runs every 10 minutes here, and every task must be in the stream within
// 5 s of its commit (a few milliseconds on an idle machine: the logged
// figures; the bound only has to stay far below the pass's interval on a
// loaded one). Commit-to-stream latency is measured by the bench command.
func TestRelayPublishesOnNotify(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, outbox.RelayConfig{PublishInterval: 10 * time.Minute})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to LISTEN", func() bool { return outbox.Listens(r) >= 1 })
	// Warm up: the relay's first pass dials Redis and prepares statements.
	warm := b.create(t, 1)
	testenv.Eventually(t, 30*time.Second, "the warm-up task published", func() bool {
		return b.count(t, `task_id = $1 AND status = 'SENT'`, warm[0]) == 1
	})

	t.Run("CommitIsPublishedWithoutThePeriodicPass", func(t *testing.T) {
		for i := range 10 {
			c, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
			if err != nil {
				t.Fatal(err)
			}
			committed := time.Now()
			want := c.Task.ID.String()
			for {
				if slicesContains(b.entries(t), want) {
					break
				}
				if time.Since(committed) > 30*time.Second {
					t.Fatalf("task %d: not in the stream 30s after commit: the NOTIFY did not wake the relay (its periodic pass is 10 minutes away)", i)
				}
				time.Sleep(200 * time.Microsecond)
			}
			t.Logf("task %d: in the stream %s after commit", i, time.Since(committed))
		}
	})

	t.Run("RollbackIsNeverPublished", func(t *testing.T) {
		before := len(b.entries(t))
		tx, err := b.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.store.CreateTx(ctx, tx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"rolled":"back"}`)})
		if err != nil {
			t.Fatal(err)
		}
		rolledBack := res[0].Task.ID.String()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// A task committed after the rollback is published; by then the
		// relay has seen everything the rollback could have left.
		c, err := b.store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"committed":true}`)})
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "the committed task published", func() bool {
			return b.count(t, `task_id = $1 AND status = 'SENT'`, c.Task.ID) == 1
		})
		if got, err := r.DrainOnce(ctx); err != nil || got.Claimed != 0 {
			t.Fatalf("DrainOnce after the rollback = %+v, %v; want nothing claimed", got, err)
		}
		entries := b.entries(t)
		if slicesContains(entries, rolledBack) || len(entries) != before+1 {
			t.Fatalf("stream has %d entries (want %d); rolled-back task present: %v", len(entries), before+1, slicesContains(entries, rolledBack))
		}
		if n := b.count(t, `task_id = $1`, res[0].Task.ID); n != 0 {
			t.Fatalf("rolled-back task has %d outbox rows", n)
		}
	})
}

func slicesContains(entries map[string]string, taskID string) bool {
	for _, id := range entries {
		if id == taskID {
			return true
		}
	}
	return false
}

func TestRelayConcurrentRelaysPublishEveryRowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rows = 10000
	b.preload(t, rows)
	relays := make([]*outbox.Relay, 4)
	for i := range relays {
		relays[i] = b.relay(t, outbox.RelayConfig{ID: fmt.Sprintf("relay-%d", i), PublishInterval: 20 * time.Millisecond})
	}
	for _, r := range relays {
		run(t, r.Run)
	}
	testenv.Eventually(t, 60*time.Second, "every row SENT", func() bool { return b.unsent(t) == 0 })
	b.checkPublishedOnce(t, rows)

	rs, err := b.db.Query(context.Background(), `SELECT claimed_by, count(*) FROM outbox_event GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	perRelay, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (string, error) {
		var by string
		var n int
		err := r.Scan(&by, &n)
		return fmt.Sprintf("%s=%d", by, n), err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rows per relay: %v", perRelay)
	if got := publishTotal(t, b, "success"); got != rows {
		t.Errorf("outbox_publish_total{result=success} = %v, want %d", got, rows)
	}
}

// publishTotal reads outbox_publish_total{result} from the bundle's
// registry.
func publishTotal(t *testing.T, b *bundle, result string) float64 {
	t.Helper()
	families, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "outbox_publish_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

func TestRelayStalledPastLeaseChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := func(id string) outbox.RelayConfig {
		return outbox.RelayConfig{ID: id, Lease: 300 * time.Millisecond, PublishTimeout: 100 * time.Millisecond}
	}
	stall := func(t *testing.T, b *bundle, r *outbox.Relay) (release func(), result <-chan outbox.DrainResult) {
		stalled, unblock := make(chan struct{}), make(chan struct{})
		outbox.SetAfterPublish(r, func() { close(stalled); <-unblock })
		out := make(chan outbox.DrainResult, 1)
		go func() {
			res, err := r.DrainOnce(ctx)
			if err != nil {
				t.Errorf("stalled DrainOnce: %v", err)
			}
			out <- res
		}()
		<-stalled
		testenv.Eventually(t, 30*time.Second, "the stalled relay's lease to expire", func() bool {
			var n int
			err := b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'ingest-outbox-pass stalled'
				  AND state = 'idle in transaction' AND state_change < now() - interval '300 milliseconds'`).Scan(&n)
			if err != nil {
				t.Fatal(err)
			}
			return n == 1
		})
		return func() { close(unblock) }, out
	}

	t.Run("TakenOver", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.create(t, 1)
		a, other := b.relay(t, cfg("stalled")), b.relay(t, cfg("other"))
		release, resA := stall(t, b, a)

		res, err := other.DrainOnce(ctx)
		if err != nil || res.Claimed != 1 || res.Published != 1 {
			t.Fatalf("other relay: %+v, %v; want 1 claimed and published", res, err)
		}
		release()
		if got := <-resA; got.Claimed != 1 || got.Published != 0 || got.Stale != 1 {
			t.Fatalf("stalled relay: %+v; want 1 claimed, 0 published, 1 stale", got)
		}
		var status, by, streamID string
		err = b.db.QueryRow(ctx, `SELECT status, claimed_by, stream_id FROM outbox_event WHERE task_id = $1`, ids[0]).Scan(&status, &by, &streamID)
		if err != nil {
			t.Fatal(err)
		}
		entries := b.entries(t)
		if status != "SENT" || by != "other" || entries[streamID] != ids[0].String() {
			t.Fatalf("row: status %s, claimed_by %s, stream_id %s; want SENT by other with its entry", status, by, streamID)
		}
		// Both relays XADDed: the duplicate is the documented at-least-once.
		if len(entries) != 2 {
			t.Fatalf("%d entries, want 2 (one per publish)", len(entries))
		}
		if again, _ := a.DrainOnce(ctx); again.Claimed != 0 {
			t.Fatalf("a SENT row was claimed again: %+v", again)
		}
	})

	t.Run("NotTakenOver", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.create(t, 1)
		a := b.relay(t, cfg("stalled"))
		release, resA := stall(t, b, a)
		release()
		if got := <-resA; got.Published != 1 || got.Stale != 0 {
			t.Fatalf("stalled relay whose claim nobody took: %+v; want it published", got)
		}
		b.checkPublishedOnce(t, 1)
	})
}

// newDedicatedRedis starts a redis-server of the test's own, and a client
// without retries (the outage is the point).
func newDedicatedRedis(t *testing.T) (*testenv.RedisServer, *redis.Client) {
	s := testenv.NewRedisServer(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	return s, c
}

func TestRelayRedisUnreachable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RetryThenPublish", func(t *testing.T) {
		t.Parallel()
		s, rdb := newDedicatedRedis(t)
		b := setupWith(t, rdb)
		const n = 50
		b.create(t, n)
		r := b.relay(t, outbox.RelayConfig{
			Backoff: backoff.Policy{Base: 400 * time.Millisecond, Max: time.Second, Jitter: 0.1}, MaxAttempts: 100,
			PublishTimeout: time.Second, Lease: 5 * time.Second, BatchSize: 100,
			PublishInterval: 20 * time.Millisecond,
		})
		s.Kill()
		res, err := r.DrainOnce(ctx)
		if err != nil || res.Claimed != n || res.Retried != n {
			t.Fatalf("DrainOnce with Redis down = %+v, %v; want %d retried", res, err, n)
		}
		var bad int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FROM outbox_event
			WHERE NOT (status = 'RETRYING' AND attempt_count = 1 AND last_error <> '' AND claimed_by IS NULL
			           AND next_retry_at > now() + interval '200 milliseconds')`).Scan(&bad); err != nil {
			t.Fatal(err)
		}
		if bad != 0 {
			t.Fatalf("%d rows are not RETRYING with one attempt, an error and a backoff", bad)
		}
		if res, _ := r.DrainOnce(ctx); res.Claimed != 0 {
			t.Fatalf("rows in backoff were claimed again: %+v", res)
		}
		run(t, r.Run) // retries while Redis is down, then publishes
		testenv.Eventually(t, 10*time.Second, "a second failed attempt", func() bool {
			return b.count(t, `attempt_count >= 2`) == n
		})
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "every row SENT after Redis is back", func() bool { return b.unsent(t) == 0 })
		b.checkPublishedOnce(t, n)
	})

	t.Run("DeadAfterMaxAttempts", func(t *testing.T) {
		t.Parallel()
		s, rdb := newDedicatedRedis(t)
		b := setupWith(t, rdb)
		const n = 10
		b.create(t, n)
		r := b.relay(t, outbox.RelayConfig{
			MaxAttempts: 2, Backoff: backoff.Policy{Base: time.Millisecond, Max: time.Millisecond, Jitter: 0.1},
			PublishTimeout: time.Second, Lease: 5 * time.Second,
		})
		s.Kill()
		var total outbox.DrainResult
		testenv.Eventually(t, 10*time.Second, "every row DEAD", func() bool {
			res, err := r.DrainOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			total.Retried += res.Retried
			total.Dead += res.Dead
			return total.Dead == n
		})
		if total.Retried != n {
			t.Fatalf("%d retries before DEAD, want %d (one per row)", total.Retried, n)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if res, err := r.DrainOnce(ctx); err != nil || res.Claimed != 0 {
			t.Fatalf("DrainOnce after Redis is back = %+v, %v; DEAD rows must stay", res, err)
		}
		if got := b.count(t, `status = 'DEAD' AND attempt_count = 2 AND last_error <> '' AND sent_at IS NULL AND next_retry_at IS NULL`); got != n {
			t.Fatalf("%d rows DEAD with 2 attempts, an error and no retry time, want %d", got, n)
		}
		if l := b.entries(t); len(l) != 0 {
			t.Fatalf("%d entries published from DEAD rows", len(l))
		}
		if got := publishTotal(t, b, "dead"); got != n {
			t.Errorf("outbox_publish_total{result=dead} = %v, want %d", got, n)
		}
	})
}

// TestRelayFailedPublishBackoff checks the retry time a failed publish
// sets: package backoff's delay for the row's failures so far (the formula
// a failed task uses too), capped at Max, due at once under a zero policy,
// and no retry time once the row is DEAD.
func TestRelayFailedPublishBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { down.Close() })
	const maxAttempts = 6
	// Row i has failed earlier[i] times before this pass; the last one
	// fails for the last allowed time.
	earlier := []int{0, 1, 2, 4, maxAttempts - 1}
	policies := []struct {
		name string
		p    backoff.Policy
	}{
		{"Hours", backoff.Policy{Base: time.Hour, Max: 4 * time.Hour, Jitter: 0.1}},
		{"SubMillisecond", backoff.Policy{Base: 1500 * time.Microsecond, Max: time.Minute}},
		{"AtOnce", backoff.Policy{Jitter: 0.1}},
	}
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			t.Parallel()
			b := setupWith(t, down)
			ids := b.create(t, len(earlier))
			for i, id := range ids {
				if _, err := b.db.Exec(ctx, `UPDATE outbox_event SET attempt_count = $2,
					status = CASE WHEN $2 > 0 THEN 'RETRYING' ELSE 'NEW' END WHERE task_id = $1`, id, earlier[i]); err != nil {
					t.Fatal(err)
				}
			}
			r := b.relay(t, outbox.RelayConfig{MaxAttempts: maxAttempts, Backoff: pc.p, PublishTimeout: time.Second, Lease: 5 * time.Second})
			var before, after time.Time
			if err := b.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			res, err := r.DrainOnce(ctx)
			if err != nil || res.Claimed != len(ids) || res.Retried != len(ids)-1 || res.Dead != 1 {
				t.Fatalf("DrainOnce with Redis down = %+v, %v; want %d retried and 1 dead", res, err, len(ids)-1)
			}
			if err := b.db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after); err != nil {
				t.Fatal(err)
			}
			for i, id := range ids {
				var status string
				var attempts int
				var next *time.Time
				if err := b.db.QueryRow(ctx, `SELECT status, attempt_count, next_retry_at FROM outbox_event WHERE task_id = $1`, id).
					Scan(&status, &attempts, &next); err != nil {
					t.Fatal(err)
				}
				attempt := earlier[i] + 1
				if attempts != attempt {
					t.Fatalf("row %d: attempt_count %d, want %d", i, attempts, attempt)
				}
				if attempt >= maxAttempts {
					if status != string(outbox.StatusDead) || next != nil {
						t.Fatalf("row %d: %s with next_retry_at %v after its last attempt, want DEAD with none", i, status, next)
					}
					continue
				}
				// The statement's now() lies between before and after.
				lo, hi := pc.p.Bounds(attempt)
				earliest, latest := before.Add(lo-time.Microsecond), after.Add(hi+time.Microsecond)
				if status != string(outbox.StatusRetrying) || next == nil || next.Before(earliest) || next.After(latest) {
					t.Fatalf("row %d: %s due %v after failure %d, want RETRYING due in [%v, %v]", i, status, next, attempt, earliest, latest)
				}
			}
		})
	}
}

func TestRelaySurvivesDroppedListenConnection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, outbox.RelayConfig{PublishInterval: time.Minute, ListenRetryMin: 10 * time.Millisecond, ListenRetryMax: 50 * time.Millisecond})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to LISTEN", func() bool { return outbox.Listens(r) >= 1 })

	for i := range 3 {
		if _, err := b.db.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = 'ingest-outbox-listener' AND datname = current_database()`); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the relay to LISTEN again", func() bool { return outbox.Listens(r) >= int64(i+2) })
		ids := b.create(t, 1)
		// The poll interval is a minute: only a NOTIFY (or the reconnect's
		// own pass) publishes this quickly.
		testenv.Eventually(t, 30*time.Second, "the task created after the reconnect published", func() bool {
			return b.count(t, `task_id = $1 AND status = 'SENT'`, ids[0]) == 1
		})
	}
	b.checkPublishedOnce(t, 3)
}

func TestRelayConcurrentWritersNoRowSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for i := range 2 {
		run(t, b.relay(t, outbox.RelayConfig{ID: fmt.Sprintf("r%d", i), PublishInterval: 20 * time.Millisecond}).Run)
	}
	const writers, perWriter = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				err := pgx.BeginFunc(ctx, b.db, func(tx pgx.Tx) error {
					_, err := b.store.CreateTx(ctx, tx, task.NewTask{Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))})
					if err != nil {
						return err
					}
					// Commit late and out of id order: a relay that
					// followed an id cursor would skip this row.
					time.Sleep(time.Duration(rand.IntN(15)) * time.Millisecond)
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := errors.Join(func() (all []error) {
		for err := range errs {
			all = append(all, err)
		}
		return
	}()...); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "every row SENT", func() bool { return b.unsent(t) == 0 })
	b.checkPublishedOnce(t, writers*perWriter)
}

func TestRelayMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, outbox.RelayConfig{BatchSize: 100})
	// A second relay on the same registry shares its metrics.
	b.relay(t, outbox.RelayConfig{})
	b.create(t, 5)
	testenv.Eventually(t, 30*time.Second, "a backlog age", func() bool {
		return gauge(t, b, "outbox_backlog_age_seconds") > 0
	})
	if got := gauge(t, b, "outbox_backlog"); got != 5 {
		t.Fatalf("outbox_backlog = %v, want 5", got)
	}
	if res, err := r.DrainOnce(ctx); err != nil || res.Published != 5 {
		t.Fatalf("DrainOnce = %+v, %v", res, err)
	}
	if got := gauge(t, b, "outbox_backlog"); got != 0 {
		t.Fatalf("outbox_backlog after publishing = %v, want 0", got)
	}
	if got := gauge(t, b, "outbox_backlog_age_seconds"); got != 0 {
		t.Fatalf("outbox_backlog_age_seconds after publishing = %v, want 0", got)
	}
	if got := publishTotal(t, b, "success"); got != 5 {
		t.Fatalf("outbox_publish_total{result=success} = %v, want 5", got)
	}
	families, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]uint64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				seen[f.GetName()] += h.GetSampleCount()
			}
		}
	}
	if seen["outbox_publish_delay_seconds"] != 5 || seen["outbox_publish_seconds"] != 1 {
		t.Fatalf("histogram sample counts %v; want 5 delays and 1 publish", seen)
	}
}

// gauge reads an unlabelled gauge from the bundle's registry (-1: absent).
func gauge(t *testing.T, b *bundle, name string) float64 {
	t.Helper()
	families, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func TestConfigValidationNamesTheField(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	cases := []struct {
		name  string
		err   error
		field string
	}{
		{"BatchSize", newRelay(outbox.RelayConfig{BatchSize: -1}), "BatchSize"},
		{"Lease", newRelay(outbox.RelayConfig{Lease: time.Second, PublishTimeout: time.Second}), "Lease"},
		{"MaxAttempts", newRelay(outbox.RelayConfig{MaxAttempts: -3}), "MaxAttempts"},
		{"BackoffMax", newRelay(outbox.RelayConfig{Backoff: backoff.Policy{Base: time.Minute, Max: time.Second}}), "Backoff.Max: must be at least Base (1m0s), got 1s"},
		{"BackoffBase", newRelay(outbox.RelayConfig{Backoff: backoff.Policy{Base: -time.Second, Max: time.Second}}), "Backoff.Base: must be at least 0s"},
		{"BackoffJitter", newRelay(outbox.RelayConfig{Backoff: backoff.Policy{Base: time.Second, Max: time.Second, Jitter: 1.5}}), "Backoff.Jitter: must be at least 0 and less than 1, got 1.5"},
		{"PublishInterval", newRelay(outbox.RelayConfig{PublishInterval: -time.Second}), "PublishInterval"},
		{"RelayNeedsPool", newRelay(outbox.RelayConfig{}), "pool"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !errors.Is(c.err, outbox.ErrConfig) || !strings.HasPrefix(c.err.Error(), "outbox: "+c.field) {
				t.Fatalf("error %v; want an outbox.ErrConfig naming %s", c.err, c.field)
			}
		})
	}

	var defaults outbox.RelayConfig
	defaultsRelay, err := outbox.NewRelay(defaults, testenv.DB(t), rdb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := defaultsRelay.Config()
	if got.BatchSize != 20 || got.PublishInterval != time.Second || got.MaxAttempts != 10 ||
		got.Backoff != (backoff.Policy{Base: time.Second, Max: 600 * time.Second, Jitter: 0.1}) || got.Lease != 30*time.Second || got.ID == "" {
		t.Fatalf("defaults %+v do not match docs/ARCHITECTURE.md §5", got)
	}
}

func newRelay(cfg outbox.RelayConfig) error {
	_, err := outbox.NewRelay(cfg, nil, nil, nil, nil)
	return err
}

// TestRelayPassLocksTheOutboxBeforeClaiming: a pass takes its write lock
// of outbox_event before its claim reads the table, so that an extension
// of the partitions (SHARE on the table, then the DEFAULT partition for
// the attach) never deadlocks with it: with SHARE held, a pass waits
// without holding any partition, the DEFAULT partition's ACCESS
// EXCLUSIVE lock is granted, and once the extension commits the pass
// publishes its row.
func TestRelayPassLocksTheOutboxBeforeClaiming(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	ids := b.create(t, 1)
	r := b.relay(t, outbox.RelayConfig{})
	if err := testenv.DuringOutboxExtension(t, b.db, func() error {
		_, err := r.DrainOnce(ctx)
		return err
	}); err != nil {
		t.Fatalf("the pass: %v", err)
	}
	if n := b.count(t, `task_id = $1 AND status = 'SENT'`, ids[0]); n != 1 {
		t.Errorf("%d SENT rows of the task after the pass, want 1", n)
	}
}
