package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
)

// statementTracer records, for each of matches, the last statement of a
// batch that contains it, and its arguments, as a relay sends them.
type statementTracer struct {
	matches []string

	mu   sync.Mutex
	seen map[string]traced
}

type traced struct {
	sql  string
	args []any
}

func (s *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (s *statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statementTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (s *statementTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	for _, m := range s.matches {
		if strings.Contains(d.SQL, m) {
			s.mu.Lock()
			if s.seen == nil {
				s.seen = map[string]traced{}
			}
			s.seen[m] = traced{d.SQL, slices.Clone(d.Args)}
			s.mu.Unlock()
		}
	}
}

func (s *statementTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// last returns the last statement that contained match, and its
// arguments.
func (s *statementTracer) last(match string) (string, []any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[match].sql, slices.Clone(s.seen[match].args)
}

// tracedPool is a pool on b's database whose connections report their
// batches to tracer.
func tracedPool(t *testing.T, b *bundle, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg := b.db.Config().Copy()
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// holdTransaction keeps a transaction open on b's database until the test
// ends, idle in transaction after taking a transaction id, as the bench's
// and the reliability suite's holds do: vacuum removes no row version that
// died after it began, and no scan may mark such an index entry dead.
func holdTransaction(t *testing.T, b *bundle) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, b.db.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	})
}

// historySQL inserts $1 QUEUED tasks and one NEW outbox row each for
// stream $2, due 100 ms apart from an hour ago: the rows a relay published
// over the last minutes.
const historySQL = `
WITH t AS (
    INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
    SELECT gen_random_uuid(), 'bulk', jsonb_build_object('i', i), md5(i::text), 3
    FROM generate_series(1, $1) AS i
    RETURNING id
)
INSERT INTO outbox_event (task_id, stream, next_retry_at)
SELECT id, $2, now() - interval '1 hour' + row_number() OVER () * interval '100 milliseconds' FROM t`

// drainAll runs passes of r until one claims nothing, and returns what
// they did in all.
func drainAll(t *testing.T, r *outbox.Relay) outbox.DrainResult {
	t.Helper()
	var total outbox.DrainResult
	for {
		res, err := r.DrainOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			return total
		}
		total.Claimed += res.Claimed
		total.Published += res.Published
		total.Held += res.Held
	}
}

// indexBuffers runs sql with args under EXPLAIN (ANALYZE, BUFFERS) after
// settings, in a transaction it rolls back, and returns the shared
// buffers its scans of the claim index read (index and heap pages; of a
// partitioned outbox_event, every partition's claim index).
func indexBuffers(t *testing.T, db *pgxpool.Pool, settings, sql string, args []any) int {
	t.Helper()
	return scanBuffers(t, db, "_claim_idx", settings, sql, args)
}

// scanBuffers is indexBuffers for the scans of the indexes whose names end
// in index.
func scanBuffers(t *testing.T, db *pgxpool.Pool, index, settings, sql string, args []any) int {
	t.Helper()
	ctx := context.Background()
	var plan []byte
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if settings != "" {
			if _, err := tx.Exec(ctx, settings); err != nil {
				return err
			}
		}
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sql, args...).Scan(&plan); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	type node struct {
		Index string `json:"Index Name"`
		Hit   int    `json:"Shared Hit Blocks"`
		Read  int    `json:"Shared Read Blocks"`
		Plans []node `json:"Plans"`
	}
	var root []struct{ Plan node }
	if err := json.Unmarshal(plan, &root); err != nil || len(root) != 1 {
		t.Fatalf("EXPLAIN output %s: %v", plan, err)
	}
	n, found := 0, false
	var walk func(node)
	walk = func(p node) {
		if strings.HasSuffix(p.Index, index) {
			n, found = n+p.Hit+p.Read, true
		}
		for _, c := range p.Plans {
			walk(c)
		}
	}
	walk(root[0].Plan)
	if !found {
		t.Fatalf("the statement reads no index *%s: %s", index, plan)
	}
	return n
}

// openWriter begins a transaction on b's database that writes a task and
// its outbox row, due at due, and leaves it open (rolled back when the test
// ends, unless committed): a writer that took its row's id and commits
// late. It returns the transaction and the task's id.
func openWriter(t *testing.T, b *bundle, due time.Time) (pgx.Tx, uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	id := uuid.New()
	if _, err := tx.Exec(ctx, `INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts) VALUES ($1, 'late', '{}', 'x', 3)`, id); err != nil {
		t.Fatal(err)
	}
	if err := outbox.InsertDue(ctx, tx, b.stream, []uuid.UUID{id}, []*time.Time{&due}); err != nil {
		t.Fatal(err)
	}
	return tx, id
}

// heldSent is how many rows sentUnderHold publishes.
const heldSent = 5000

// sentUnderHold holds a transaction open on b's database, then has a relay
// (id, batches of 500, a poll an hour apart) publish heldSent rows due
// 100 ms apart from an hour ago, whose entries stay in the claim index,
// and returns the relay.
func sentUnderHold(t *testing.T, b *bundle, id string) *outbox.Relay {
	t.Helper()
	r := b.relay(t, outbox.RelayConfig{ID: id, BatchSize: 500, PublishInterval: time.Hour})
	holdTransaction(t, b)
	if _, err := b.db.Exec(context.Background(), historySQL, heldSent, b.stream); err != nil {
		t.Fatal(err)
	}
	drainAll(t, r)
	return r
}

// errRollback ends a pgx.BeginFunc with a rollback.
var errRollback = errors.New("rolled back")

// TestRelayClaimSkipsWhatAHeldTransactionKeeps: with a transaction held
// open, every row sent since it began keeps its entry in the claim index,
// in front of the unsent rows. The relay's claim and its due timer's query
// must not read them all: their scans of the claim index read a number of
// pages of the order of a batch, not of the rows sent since the hold
// began (a scan from the front of the index, as both made before, reads
// them all).
func TestRelayClaimSkipsWhatAHeldTransactionKeeps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const claimMatch, dueMatch = "FOR UPDATE SKIP LOCKED", "extract(epoch FROM next_retry_at - now())"
	tracer := &statementTracer{matches: []string{claimMatch, dueMatch}}
	pool := tracedPool(t, b, tracer)
	// No periodic claim from the front during the test: only the first.
	r, err := outbox.NewRelay(outbox.RelayConfig{ID: "held", BatchSize: 500, PublishInterval: time.Hour}, pool, b.rdb, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	holdTransaction(t, b)

	const sent, batch = 10000, 20
	if _, err := b.db.Exec(ctx, historySQL, sent, b.stream); err != nil {
		t.Fatal(err)
	}
	drainAll(t, r)
	b.preload(t, batch)
	if res, err := r.DrainOnce(ctx); err != nil || res.Published != batch {
		t.Fatalf("DrainOnce = %+v, %v; want %d published", res, err, batch)
	}
	if got := b.count(t, `status = 'SENT'`); got != sent+batch {
		t.Fatalf("%d rows SENT, want %d", got, sent+batch)
	}

	// The claim the relay sent last, run again over the next batch.
	b.preload(t, batch)
	if _, err := outbox.NextDue(ctx, r); err != nil {
		t.Fatal(err)
	}
	settings, _ := outbox.ClaimStatements()
	for _, st := range []struct {
		name, match string
		bound       int // the argument that is the bound
	}{{"claim", claimMatch, 1}, {"due timer", dueMatch, 0}} {
		sql, args := tracer.last(st.match)
		if sql == "" {
			t.Fatalf("the relay sent no %s", st.name)
		}
		front := slices.Clone(args)
		if len(front) > st.bound {
			front[st.bound] = "-infinity"
		}
		relayReads := indexBuffers(t, b.db, settings, sql, args)
		frontReads := indexBuffers(t, b.db, settings, sql, front)
		t.Logf("%s with %d unsent rows and %d sent rows kept by a held transaction: %d buffers; from the front of the index: %d",
			st.name, batch, sent, relayReads, frontReads)
		// The sent rows' entries and heap tuples fill a page per 50
		// rows or fewer: reading them all reads more than sent/50 pages.
		if frontReads < sent/50 {
			t.Fatalf("a %s from the front of the index read %d buffers: the held transaction kept no entries of sent rows", st.name, frontReads)
		}
		if relayReads > 3*batch {
			t.Errorf("the relay's %s read %d buffers with %d rows unsent, from the front %d: it reads the %d sent rows' entries",
				st.name, relayReads, batch, frontReads, sent)
		}
	}
}

// TestRelayPublishesRowCommittedLate: a row whose next_retry_at sorts
// before where the relay's claims begin (a row committed late: a long
// transaction, a due time in the past) is published by the relay's next
// claim from the front of the index, which comes once every
// PublishInterval by the relay's clock.
func TestRelayPublishesRowCommittedLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const every = time.Minute
	r := b.relay(t, outbox.RelayConfig{ID: "late", PublishInterval: every})
	var mu sync.Mutex
	clock := time.Now()
	outbox.SetClock(r, func() time.Time { mu.Lock(); defer mu.Unlock(); return clock })
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }

	// A long transaction writes its row first and commits last.
	tx, late := openWriter(t, b, time.Now().Add(-time.Hour))
	b.createRows(t, 2)
	if res, err := r.DrainOnce(ctx); err != nil || res.Published != 2 {
		t.Fatalf("DrainOnce = %+v, %v; want the 2 rows committed published", res, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Within the period the claims begin near the rows they published
	// last, after the late row.
	b.createRows(t, 2)
	if res, err := r.DrainOnce(ctx); err != nil || res.Published != 2 {
		t.Fatalf("DrainOnce = %+v, %v; want the 2 new rows published", res, err)
	}
	if n := b.count(t, `task_id = $1 AND status = 'NEW'`, late); n != 1 {
		t.Fatalf("the late row is published before the claim from the front (%d NEW); the test shows nothing", n)
	}
	advance(every)
	if res, err := r.DrainOnce(ctx); err != nil || res.Published != 1 {
		t.Fatalf("DrainOnce a period later = %+v, %v; want the late row published", res, err)
	}
	if n := b.count(t, `task_id = $1 AND status = 'SENT'`, late); n != 1 {
		t.Fatalf("the late row is not SENT after the claim from the front")
	}
	b.checkPublishedOnce(t, 5)
}

// TestRelaysPublishRowsCommittedLate: two relays running as a service
// runs them publish every row once, within a few polls, while rows arrive
// behind where their claims begin: written by a transaction that stays
// open while the relays publish newer rows, due a minute or more ago.
func TestRelaysPublishRowsCommittedLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const interval = 100 * time.Millisecond
	for _, id := range []string{"r0", "r1"} {
		run(t, b.relay(t, outbox.RelayConfig{ID: id, PublishInterval: interval}).Run)
	}
	rows := 0
	for round := range 5 {
		tx, err := b.db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids := []uuid.UUID{uuid.New(), uuid.New()}
		for _, id := range ids {
			if _, err := tx.Exec(ctx, `INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts) VALUES ($1, 'late', '{}', 'x', 3)`, id); err != nil {
				t.Fatal(err)
			}
		}
		past := time.Now().Add(-time.Duration(round+1) * time.Minute)
		if err := outbox.InsertDue(ctx, tx, b.stream, ids, []*time.Time{&past}); err != nil {
			t.Fatal(err)
		}
		newer := b.create(t, 10)
		testenv.Eventually(t, 10*time.Second, "the newer rows published", func() bool {
			return b.count(t, `task_id = ANY($1) AND status = 'SENT'`, newer) == len(newer)
		})
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		rows += len(ids) + len(newer)
	}
	testenv.Eventually(t, 100*interval, "every row SENT", func() bool { return b.unsent(t) == 0 })
	b.checkPublishedOnce(t, rows)
}

// TestRelayFindsLateRowsByID: between its claims from the front of the
// claim index (a minute apart), a relay finds a row committed late by its
// poll's read by id: the row of a transaction that took its id before
// newer rows were published, and committed once the relay's claims had
// passed its due time. The read's floor never passes the id of a
// transaction still open. And with a transaction held open, the read by
// id reads the rows created since the previous reads, not every row sent
// since the hold began, as a claim from the front of the index does.
func TestRelayFindsLateRowsByID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// No claim from the front by time during the test: only the first,
	// and those after the first reads by id, which know no floor yet.
	r := sentUnderHold(t, b, "by-id")
	// publish publishes n new rows as the relay does between polls, and
	// runs the poll's read by id.
	publish := func(n int) {
		t.Helper()
		b.preload(t, n)
		drainAll(t, r)
		outbox.ReadLate(ctx, r)
	}
	for range 3 {
		publish(20)
	}

	// A writer takes its id and stays open while newer rows are published
	// and the relay polls.
	tx, late := openWriter(t, b, time.Now().Add(-time.Minute))
	for range 3 {
		publish(20)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.preload(t, 20)
	drainAll(t, r)
	if n := b.count(t, `task_id = $1 AND status = 'NEW'`, late); n != 1 {
		t.Fatalf("the late row was published by a claim from the relay's bound (%d NEW): the test shows nothing", n)
	}
	outbox.ReadLate(ctx, r)
	drainAll(t, r)
	if n := b.count(t, `task_id = $1 AND status = 'SENT'`, late); n != 1 {
		t.Fatalf("the late row is not SENT after the poll's read by id and a claim")
	}
	b.checkPublishedOnce(t, heldSent+7*20+1)

	// What a poll reads: from the floor on the primary key, against a
	// claim from the front.
	for range 3 {
		publish(20)
	}
	settings, sql, args := outbox.LateRead(r)
	if args[0].(int64) < 0 {
		t.Fatalf("the relay knows no floor after %d polls", 10)
	}
	byID := scanBuffers(t, b.db, "_pkey", settings, sql, args)
	claimSettings, claim := outbox.ClaimStatements()
	front := indexBuffers(t, b.db, claimSettings, claim, []any{500, "-infinity"})
	t.Logf("with %d sent rows kept by a held transaction, a read by id read %d buffers; a claim from the front %d", heldSent, byID, front)
	if front < heldSent/50 {
		t.Fatalf("a claim from the front read %d buffers: the held transaction kept no entries of sent rows", front)
	}
	if byID > front/5 {
		t.Errorf("the read by id read %d buffers, a claim from the front %d: it reads the sent rows' entries", byID, front)
	}
}

// TestBacklogGaugesSkipWhatAHeldTransactionKeeps: the backlog gauges read
// what a read of every unsent row reads (ReadBacklog): a row due half an
// hour ago (before the gauges' cutoff: read in the part they read once a
// minute), rows due now and rows scheduled in an hour. And with a
// transaction held open and thousands of rows sent an hour ago, a
// scrape's read of the rows due from a minute ago on reads a few pages,
// where a read of every unsent row walks the sent rows' entries too.
func TestBacklogGaugesSkipWhatAHeldTransactionKeeps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	sentUnderHold(t, b, "gauges")
	for _, due := range []time.Duration{-30 * time.Minute, time.Hour, time.Hour} {
		tx, _ := openWriter(t, b, time.Now().Add(due))
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.preload(t, 20)

	got, err := outbox.BacklogGauges(b.db, time.Minute)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, err := outbox.ReadBacklog(ctx, b.db, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Due != 21 || got.Scheduled != 2 || got.Due != want.Due || got.Scheduled != want.Scheduled {
		t.Errorf("the gauges read %+v, every unsent row %+v; want 21 due and 2 scheduled", got, want)
	}
	if d := got.OldestDue - want.OldestDue; d < -2*time.Second || d > 2*time.Second {
		t.Errorf("the gauges' oldest due %s, every unsent row's %s", got.OldestDue, want.OldestDue)
	}

	settings, head, all := outbox.BacklogStatements()
	headReads := indexBuffers(t, b.db, settings, head, []any{time.Now().Add(-time.Minute)})
	allReads := indexBuffers(t, b.db, settings, all, nil)
	t.Logf("with %d sent rows kept by a held transaction, a scrape's read of the rows due from a minute ago read %d buffers; of every unsent row %d", heldSent, headReads, allReads)
	if allReads < heldSent/50 {
		t.Fatalf("a read of every unsent row read %d buffers: the held transaction kept no entries of sent rows", allReads)
	}
	if headReads > allReads/5 {
		t.Errorf("a scrape's read read %d buffers, a read of every unsent row %d: it reads the sent rows' entries", headReads, allReads)
	}
}
