package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// TestNoisyNeighbour: one group creates 90% of N tasks in a burst while
// nine quiet groups create the rest at a steady pace, on three workers.
// With fair scheduling (the burst has a group_key, the kind a group
// window W) a quiet task waits behind at most about a window of the
// burst: the burst tasks that start between a quiet task's creation and
// its start are bounded by W plus the workers' handler slots, whatever
// N; without it (the burst without a group: one FIFO stream) they are
// most of the burst. The figures are positions, not times, so the bound
// holds on any machine; the commit→start times of the quiet groups with
// no burst, with the burst and fairness, and with the burst and no
// fairness are logged, with how long the quiet creates themselves took
// from the client (a loaded machine's share, apart from any queueing
// behind the burst). The burst group still runs many tasks at once:
// the capacity the quiet groups leave is used. INGEST_NOISY_N sets N
// (default 2000; the figure is 50000).
func TestNoisyNeighbour(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	noisyNeighbour(t, noisyEnv{pool: b.db.Pool, store: b.store, work: func(name string, slots int, handlers map[string]ingest.Handler) {
		cfg := b.fastConfig(name)
		cfg.Concurrency = slots
		b.run(cfg, handlers, slog.LevelError)
	}})
}

// TestKafkaNoisyNeighbour is TestNoisyNeighbour in Kafka mode: the group
// windows are kept in PostgreSQL whatever carries the tasks, so the bound
// is the same; the three workers share a topic of six partitions.
func TestKafkaNoisyNeighbour(t *testing.T) {
	t.Parallel()
	kb := ksetup(t, 6, task.Config{})
	noisyNeighbour(t, noisyEnv{pool: kb.db, store: kb.store, work: func(name string, slots int, handlers map[string]ingest.Handler) {
		cfg := ingest.Config{
			Store: kb.store.Config(), Consumer: name, Concurrency: slots, TaskLease: time.Second, ShutdownTimeout: 5 * time.Second,
			Relay: outbox.RelayConfig{PublishInterval: 100 * time.Millisecond, MaxAttempts: 1000, Lease: 2 * time.Second, PublishTimeout: 500 * time.Millisecond},
			Maintenance: maintenance.Config{
				Rescuer:   maintenance.RescuerConfig{Interval: 200 * time.Millisecond, Grace: 300 * time.Millisecond},
				Retention: maintenance.RetentionConfig{Interval: 200 * time.Millisecond},
			},
		}
		runServiceOn(t, cfg, kb.db, ingest.Kafka(kb.kcfg()), handlers, slog.New(kb.logs))
	}, ready: func(workers int) {
		// The group's rebalances as the workers join would otherwise
		// fall into the first phase's waits.
		cl, err := kgo.NewClient(kgo.SeedBrokers(kb.brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		adm := kadm.NewClient(cl)
		testenv.Eventually(t, time.Minute, "the workers share the topic's partitions", func() bool {
			gs, err := adm.DescribeGroups(kb.ctx, kafka.DefaultGroup)
			if err != nil {
				return false
			}
			g, ok := gs[kafka.DefaultGroup]
			if !ok || g.Err != nil || g.State != "Stable" || len(g.Members) != workers {
				return false
			}
			for _, m := range g.Members {
				if a, ok := m.Assigned.AsConsumer(); !ok || len(a.Topics) == 0 {
					return false
				}
			}
			return true
		})
	}})
}

// noisyEnv is what noisyNeighbour runs on: a database, a store creating
// tasks for the transport's workers, and a way to start one of them.
type noisyEnv struct {
	pool  *pgxpool.Pool
	store *task.Store
	// work runs a worker called name, with slots handler slots and
	// handlers, until the test ends.
	work func(name string, slots int, handlers map[string]ingest.Handler)
	// ready, when set, returns once the workers started are ready to
	// take tasks.
	ready func(workers int)
}

// noisyKnob reads the whole number of environment variable name, def when
// unset, failing the test when it is not one from lo to hi.
func noisyKnob(t *testing.T, name string, def, lo, hi int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		t.Fatalf("%s=%q: want a whole number from %d to %d", name, v, lo, hi)
	}
	return n
}

// noisyNeighbour runs the noisy neighbour on env. Besides INGEST_NOISY_N,
// three variables vary it for measurements (the bound in positions holds
// with any of them): INGEST_NOISY_WINDOW, the kinds' group window
// (default twice the handler slots of all workers);
// INGEST_NOISY_QUIET_PRIORITY, the quiet tasks' priority (default 2, as
// the burst's); INGEST_NOISY_CONCURRENCY_PER_GROUP, the kinds'
// concurrency_per_group (default none).
func noisyNeighbour(t *testing.T, env noisyEnv) {
	n := noisyKnob(t, "INGEST_NOISY_N", 2000, 100, 10_000_000)
	ctx := context.Background()
	const (
		workers = 3
		slots   = 8 // handler slots per worker
		quietN  = 9
	)
	window := noisyKnob(t, "INGEST_NOISY_WINDOW", 2*workers*slots, 1, task.MaxConcurrency)
	quietPriority := noisyKnob(t, "INGEST_NOISY_QUIET_PRIORITY", 0, 0, 4)
	groupCap := noisyKnob(t, "INGEST_NOISY_CONCURRENCY_PER_GROUP", 0, 0, task.MaxConcurrency)
	work := func(context.Context, ingest.Task) error { time.Sleep(2 * time.Millisecond); return nil } // the work
	handlers := map[string]ingest.Handler{"base": work, "fair": work, "fifo": work}
	for _, kind := range []string{"base", "fair", "fifo"} {
		w := window
		ku := task.KindUpdate{GroupWindow: &w}
		if groupCap > 0 {
			ku.ConcurrencyPerGroup = &groupCap
		}
		if _, err := env.store.SetKind(ctx, "test", kind, ku); err != nil {
			t.Fatal(err)
		}
	}
	for i := range workers {
		env.work(fmt.Sprintf("w%d", i), slots, handlers)
	}
	if env.ready != nil {
		env.ready(workers)
	}
	query := func(q string) int {
		t.Helper()
		var n int
		if err := env.pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	burstN := n * 9 / 10
	quietTotal := n - burstN
	perGroup := max(quietTotal/quietN, 1)
	// phase creates the quiet groups' tasks of kind at a steady pace and,
	// when burst, the burst group's (with group key burstKey) at once, in
	// batches of 500; it returns when every task of the kind SUCCEEDED.
	// createTimes are the quiet creates' own times by kind, from the
	// client: what the machine's load costs a create, apart from any
	// queueing behind the burst.
	createTimes := map[string][]time.Duration{}
	// returned is when each quiet create returned to the client: its
	// commit, as the producer sees it.
	returned := map[uuid.UUID]time.Time{}
	phase := func(kind string, burst bool, burstKey string) {
		var wg sync.WaitGroup
		if burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for left := burstN; left > 0; {
					m := min(left, 500)
					nts := make([]task.NewTask, m)
					for i := range nts {
						nts[i] = task.NewTask{Kind: kind, GroupKey: burstKey, Payload: json.RawMessage(`{"burst":true}`)}
					}
					if _, err := env.store.CreateBatch(ctx, nts); err != nil {
						t.Error(err)
						return
					}
					left -= m
				}
			}()
		}
		tick := time.NewTicker(10 * time.Millisecond) // the quiet groups' pace
		defer tick.Stop()
		for range perGroup {
			<-tick.C
			for g := range quietN {
				began := time.Now()
				res, err := env.store.Create(ctx, task.NewTask{Kind: kind, GroupKey: fmt.Sprintf("quiet-%d", g), Payload: json.RawMessage(`{}`), Priority: quietPriority})
				if err != nil {
					t.Fatal(err)
				}
				now := time.Now()
				createTimes[kind] = append(createTimes[kind], now.Sub(began))
				returned[res.Task.ID] = now
			}
		}
		wg.Wait()
		want := perGroup * quietN
		if burst {
			want += burstN
		}
		testenv.Eventually(t, time.Duration(n/10+60)*time.Second, kind+": every task SUCCEEDED", func() bool {
			return query(fmt.Sprintf(`SELECT count(*) FROM ingest_task WHERE kind = '%s' AND status = 'SUCCEEDED'`, kind)) == want
		})
	}

	type run struct {
		id                  uuid.UUID
		quiet               bool
		created, start, end time.Time
		queued, sent        time.Time // the task's first outbox row: written, published
	}
	runs := func(kind string) []run {
		rows, err := env.pool.Query(ctx, `
SELECT t.id, coalesce(t.group_key, '') LIKE 'quiet-%', t.created_at, tr.created_at,
       (SELECT min(e.created_at) FROM ingest_task_transition e WHERE e.task_id = tr.task_id AND e.id > tr.id),
       coalesce(o.created_at, t.created_at), coalesce(o.sent_at, tr.created_at)
FROM ingest_task t LEFT JOIN LATERAL (
    SELECT created_at, sent_at FROM outbox_event x WHERE x.task_id = t.id ORDER BY x.id LIMIT 1) o ON true
JOIN LATERAL (
    SELECT id, task_id, created_at FROM ingest_task_transition x WHERE x.task_id = t.id AND x.to_status = 'RUNNING' ORDER BY x.id LIMIT 1) tr ON true
WHERE t.kind = $1`, kind)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []run
		for rows.Next() {
			var r run
			if err := rows.Scan(&r.id, &r.quiet, &r.created, &r.start, &r.end, &r.queued, &r.sent); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	type figures struct {
		p50, p95       time.Duration
		ahead95, ahead int // burst starts during a quiet task's wait: p95, most
		burstAtOnce    int
		burstSpan      time.Duration // the burst's first start to its last end
		// Where a quiet task's wait went: held back (parked) tasks,
		// commit to publish (p95) and publish to start (p95).
		parked                int
		publish95, inStream95 time.Duration
		create50, create95    time.Duration // the quiet creates, client side
		// From each quiet create's return to the client to its start.
		fromReturn50, fromReturn95 time.Duration
	}
	measure := func(kind string) figures {
		rs := runs(kind)
		var waits, publish, inStream, fromReturn []time.Duration
		var burstStarts []time.Time
		var burst []run
		var f figures
		for _, r := range rs {
			if r.quiet {
				waits = append(waits, r.start.Sub(r.created))
				publish = append(publish, r.sent.Sub(r.created))
				inStream = append(inStream, r.start.Sub(r.sent))
				if at, ok := returned[r.id]; ok {
					fromReturn = append(fromReturn, r.start.Sub(at))
				}
				if r.queued.After(r.created) {
					f.parked++
				}
			} else {
				burstStarts = append(burstStarts, r.start)
				burst = append(burst, r)
			}
		}
		for _, ds := range [][]time.Duration{waits, publish, inStream, fromReturn} {
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		}
		sort.Slice(burstStarts, func(i, j int) bool { return burstStarts[i].Before(burstStarts[j]) })
		if len(waits) > 0 {
			f.p50, f.p95 = waits[len(waits)/2], waits[len(waits)*95/100]
			f.publish95, f.inStream95 = publish[len(publish)*95/100], inStream[len(inStream)*95/100]
		}
		if len(fromReturn) > 0 {
			f.fromReturn50, f.fromReturn95 = fromReturn[len(fromReturn)/2], fromReturn[len(fromReturn)*95/100]
		}
		var ahead []int
		for _, r := range rs {
			if !r.quiet {
				continue
			}
			lo := sort.Search(len(burstStarts), func(i int) bool { return burstStarts[i].After(r.created) })
			hi := sort.Search(len(burstStarts), func(i int) bool { return !burstStarts[i].Before(r.start) })
			ahead = append(ahead, max(hi-lo, 0))
		}
		sort.Ints(ahead)
		if len(ahead) > 0 {
			f.ahead95, f.ahead = ahead[len(ahead)*95/100], ahead[len(ahead)-1]
		}
		type edge struct {
			at time.Time
			d  int
		}
		var es []edge
		for _, r := range burst {
			es = append(es, edge{r.start, 1}, edge{r.end, -1})
		}
		sort.Slice(es, func(i, j int) bool {
			if es[i].at.Equal(es[j].at) {
				return es[i].d < es[j].d
			}
			return es[i].at.Before(es[j].at)
		})
		if len(es) > 0 {
			f.burstSpan = es[len(es)-1].at.Sub(es[0].at)
		}
		for c, i := 0, 0; i < len(es); i++ {
			c += es[i].d
			f.burstAtOnce = max(f.burstAtOnce, c)
		}
		if ds := createTimes[kind]; len(ds) > 0 {
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			f.create50, f.create95 = ds[len(ds)/2], ds[len(ds)*95/100]
		}
		return f
	}

	phase("base", false, "")
	phase("fair", true, "burst")
	phase("fifo", true, "") // no group: one FIFO stream, no fairness
	base, fair, fifo := measure("base"), measure("fair"), measure("fifo")
	t.Logf("N=%d (burst %d, quiet %d in %d groups), %d workers x %d slots, window %d; commit->start of the quiet groups, measured under load:",
		n, burstN, perGroup*quietN, quietN, workers, slots, window)
	t.Logf("  no burst:           p50 %v p95 %v", base.p50, base.p95)
	for _, x := range []struct {
		name string
		f    figures
	}{{"no burst", base}, {"burst, fair", fair}, {"burst, no fairness", fifo}} {
		t.Logf("  %-19s quiet tasks held back %d; commit->publish p95 %v, publish->start p95 %v; a quiet create took p50 %v p95 %v; its return->start p50 %v p95 %v",
			x.name+":", x.f.parked, x.f.publish95, x.f.inStream95, x.f.create50, x.f.create95, x.f.fromReturn50, x.f.fromReturn95)
	}
	t.Logf("  burst, fair:        p50 %v p95 %v; burst starts during a quiet wait p95 %d, most %d; burst runs at once %d, burst took %v",
		fair.p50, fair.p95, fair.ahead95, fair.ahead, fair.burstAtOnce, fair.burstSpan)
	t.Logf("  burst, no fairness: p50 %v p95 %v; burst starts during a quiet wait p95 %d, most %d; burst runs at once %d, burst took %v",
		fifo.p50, fifo.p95, fifo.ahead95, fifo.ahead, fifo.burstAtOnce, fifo.burstSpan)

	// The bound: a quiet task waits behind at most the burst's window in
	// the stream and what the handler slots hold, whatever N.
	if bound := window + 2*workers*slots; fair.ahead95 > bound {
		t.Errorf("with fair scheduling, %d burst tasks started during a quiet task's wait (p95), the bound is %d", fair.ahead95, bound)
	}
	// The burst group used the capacity the quiet groups left: it had
	// several runs at once, as without fairness.
	if fair.burstAtOnce < 2 {
		t.Errorf("the burst group never had more than %d run at once", fair.burstAtOnce)
	}
}

// TestGroupWeightsShare: two groups that both keep a kind busy, of
// weights 3 and 1, on a worker: of the first starts (from the audit
// trail), the heavy group's are about three times the light one's. The
// bounds are loose (2 to 4.5): the weights fix the windows, which the
// end of each run refills, and the stream serves them in order.
func TestGroupWeightsShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	w := 4
	if _, err := b.store.SetKind(ctx, "test", "weighted", task.KindUpdate{GroupWindow: &w, GroupWeights: map[string]int{"heavy": 3}}); err != nil {
		t.Fatal(err)
	}
	cfg := b.fastConfig("w0")
	cfg.Concurrency = 2
	b.run(cfg, map[string]ingest.Handler{"weighted": func(context.Context, ingest.Task) error { return nil }}, slog.LevelError)
	const each = 150
	for _, g := range []string{"heavy", "light"} {
		nts := make([]task.NewTask, each)
		for i := range nts {
			nts[i] = task.NewTask{Kind: "weighted", GroupKey: g, Payload: json.RawMessage(`{}`)}
		}
		if _, err := b.store.CreateBatch(ctx, nts); err != nil {
			t.Fatal(err)
		}
	}
	// Until one group runs out of parked tasks, both keep their windows
	// full: count the starts while the light group's backlog lasts.
	const counted = 120
	b.eventually(time.Minute, "the first starts", func() bool {
		return b.query(`SELECT count(*) FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
			WHERE t.kind = 'weighted' AND tr.to_status = 'RUNNING'`) >= counted
	})
	heavy := b.query(fmt.Sprintf(`SELECT count(*) FILTER (WHERE g = 'heavy') FROM (
		SELECT t.group_key AS g FROM ingest_task_transition tr JOIN ingest_task t ON t.id = tr.task_id
		WHERE t.kind = 'weighted' AND tr.to_status = 'RUNNING' ORDER BY tr.id LIMIT %d) s`, counted))
	light := counted - heavy
	if light == 0 || float64(heavy)/float64(light) < 2 || float64(heavy)/float64(light) > 4.5 {
		t.Errorf("of the first %d starts, heavy (weight 3) %d and light (weight 1) %d; want about 3:1", counted, heavy, light)
	}
	t.Logf("of the first %d starts: heavy %d, light %d", counted, heavy, light)
}

// TestCompletionsWakeTheirOwnRelay: a worker's completions that refill a
// group's window write the next task's outbox row without a NOTIFY (whose
// commit PostgreSQL serializes with every other notifying commit) and
// wake the worker's own relay instead: a chain of tasks through a window
// of 1 runs to its end with the relay's poll an hour away, and the
// outbox channel hears nothing from the completions.
func TestCompletionsWakeTheirOwnRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newServiceBundle(t)
	w := 1
	if _, err := b.store.SetKind(ctx, "test", "chain", task.KindUpdate{GroupWindow: &w}); err != nil {
		t.Fatal(err)
	}
	const n = 6
	nts := make([]task.NewTask, n)
	for i := range nts {
		nts[i] = task.NewTask{Kind: "chain", GroupKey: "g", Payload: json.RawMessage(`{}`)}
	}
	if _, err := b.store.CreateBatch(ctx, nts); err != nil {
		t.Fatal(err)
	}
	if parked := b.query(`SELECT count(*) FROM ingest_task WHERE kind = 'chain' AND parked_at IS NOT NULL`); parked != n-1 {
		t.Fatalf("%d tasks held back by the window of 1, want %d", parked, n-1)
	}
	conn, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.NotifyChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}

	cfg := b.fastConfig("w0")
	cfg.Relay.PublishInterval = time.Hour // no poll: a NOTIFY or a wake
	// Nothing but the completions writes outbox rows.
	cfg.Maintenance.RescuerDisabled, cfg.Maintenance.ReleaserDisabled = true, true
	b.run(cfg, map[string]ingest.Handler{"chain": func(context.Context, ingest.Task) error { return nil }}, slog.LevelError)
	b.eventually(time.Minute, "the chain SUCCEEDED", func() bool {
		return b.query(`SELECT count(*) FROM ingest_task WHERE kind = 'chain' AND status = 'SUCCEEDED'`) == n
	})
	if refilled := b.query(`SELECT count(*) FROM outbox_event o JOIN ingest_task t ON t.id = o.task_id WHERE t.kind = 'chain'`); refilled != n {
		t.Fatalf("%d outbox rows for the chain, want %d", refilled, n)
	}
	// A marker sent now comes first if the completions notified nothing.
	if _, err := b.db.Pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, outbox.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	nt, err := conn.Conn().WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if nt.Payload != "marker" {
		t.Fatalf("a completion that refilled the window notified the relays (%q before the marker)", nt.Payload)
	}
}
