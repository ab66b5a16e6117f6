package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// claimedBy returns the claimed_by of the outbox row of each task ("" when
// unclaimed).
func (b *bundle) claimedBy(t *testing.T, ids []uuid.UUID) map[uuid.UUID]string {
	t.Helper()
	rows, err := b.db.Query(context.Background(),
		`SELECT task_id, coalesce(claimed_by, '') FROM outbox_event WHERE task_id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uuid.UUID]string{}
	var id uuid.UUID
	var by string
	if _, err := pgx.ForEachRow(rows, []any{&id, &by}, func() error { out[id] = by; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// taskTx creates n tasks of kind in one transaction and, before its end,
// calls f with the transaction and their ids; the transaction is then
// committed or rolled back. It returns the ids.
func (b *bundle) taskTx(t *testing.T, n int, kind string, commit bool, f func(tx pgx.Tx, ids []uuid.UUID)) []uuid.UUID {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	if _, err := tx.Exec(ctx, `INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
		SELECT id, $2, '{}', 'sha', 3 FROM unnest($1::uuid[]) AS t(id)`, ids, kind); err != nil {
		t.Fatal(err)
	}
	f(tx, ids)
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// messages returns the messages of tasks ids of kind, to b's stream.
func (b *bundle) messages(ids []uuid.UUID, kind string) []outbox.Message {
	msgs := make([]outbox.Message, len(ids))
	for i, id := range ids {
		msgs[i] = outbox.Message{Stream: b.stream, TaskID: id, Kind: kind}
	}
	return msgs
}

// insertClaimed writes n tasks and their outbox rows through a writer of r
// with claimed rows, in one transaction, committed or rolled back, and
// returns the ids and the claim.
func (b *bundle) insertClaimed(t *testing.T, r *outbox.Relay, n int, commit bool) ([]uuid.UUID, outbox.Claim) {
	t.Helper()
	var claim outbox.Claim
	w := outbox.NewWriter(r, outbox.PublishClaimed)
	ids := b.taskTx(t, n, "direct", commit, func(tx pgx.Tx, ids []uuid.UUID) {
		var err error
		if claim, err = w.StageCreated(context.Background(), tx, b.messages(ids, "direct")); err != nil {
			t.Fatal(err)
		}
	})
	return ids, claim
}

// TestDirectPublishing: rows written claimed by a running relay are
// published by it as soon as the claim is handed over; relay passes (woken
// by the insert's NOTIFY) skip them, being claimed.
func TestDirectPublishing(t *testing.T) {
	b := setup(t)
	r := b.relay(t, outbox.RelayConfig{ID: "direct-relay", PublishInterval: time.Hour, DirectBacklog: 2})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })

	ids, claim := b.insertClaimed(t, r, 3, true)
	for id, by := range b.claimedBy(t, ids) {
		if by != "direct-relay" {
			t.Fatalf("task %s: outbox row claimed by %q, want the relay's claim", id, by)
		}
	}
	if got, err := r.DrainOnce(context.Background()); err != nil || got.Claimed != 0 {
		t.Fatalf("a relay pass claimed %+v, %v: the rows are claimed, it must skip them", got, err)
	}
	claim.Publish()
	testenv.Eventually(t, 30*time.Second, "the claimed rows published", func() bool {
		return b.count(t, `task_id = ANY($1) AND status = 'SENT' AND claimed_by = 'direct-relay'`, ids) == 3
	})
	b.checkPublishedOnce(t, 3)
	if got := publishTotal(t, b, "success"); got != 3 {
		t.Errorf("publish total = %v, want 3", got)
	}

	t.Run("DiscardFreesTheSlot", func(t *testing.T) {
		// DirectBacklog is 2: two discarded claims must leave room for two more.
		for range 2 {
			_, c := b.insertClaimed(t, r, 1, false)
			c.Discard()
		}
		var claims []outbox.Claim
		for range 2 {
			_, c := b.insertClaimed(t, r, 1, true)
			if outbox.ClaimLen(c) != 1 {
				t.Fatalf("after discards, a new batch went unclaimed: the slots were not freed")
			}
			claims = append(claims, c)
		}
		for _, c := range claims {
			c.Publish()
		}
		testenv.Eventually(t, 30*time.Second, "every row published", func() bool { return b.unsent(t) == 0 })
	})
}

// TestDirectPublishingFallsBack: when the relay is not running, or its
// backlog of claims is full, the writer writes ordinary unclaimed rows,
// which a relay pass publishes.
func TestDirectPublishingFallsBack(t *testing.T) {
	b := setup(t)
	r := b.relay(t, outbox.RelayConfig{ID: "fallback-relay", PublishInterval: time.Hour, DirectBacklog: 1})

	ids, claim := b.insertClaimed(t, r, 2, true)
	if by := b.claimedBy(t, ids); outbox.ClaimLen(claim) != 0 || by[ids[0]] != "" || by[ids[1]] != "" {
		t.Fatalf("relay not running: a claim of %d rows, rows claimed by %v; want none", outbox.ClaimLen(claim), by)
	}
	claim.Publish() // a zero claim: a no-op
	claim.Discard()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
	testenv.Eventually(t, 30*time.Second, "the unclaimed rows published by a pass", func() bool { return b.unsent(t) == 0 })

	// A relay pass woken by the NOTIFY may claim unclaimed rows at any
	// moment, so the claims are told apart by what the writer returned.
	_, first := b.insertClaimed(t, r, 1, true) // takes the only slot
	_, over := b.insertClaimed(t, r, 1, true)
	if outbox.ClaimLen(first) != 1 || outbox.ClaimLen(over) != 0 {
		t.Fatalf("backlog of 1: claims of %d and %d rows, want 1 and 0", outbox.ClaimLen(first), outbox.ClaimLen(over))
	}
	first.Publish()
	testenv.Eventually(t, 30*time.Second, "both rows published", func() bool { return b.unsent(t) == 0 })

	b.checkPublishedOnce(t, 4)

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	ids, claim = b.insertClaimed(t, r, 1, true)
	if by := b.claimedBy(t, ids)[ids[0]]; outbox.ClaimLen(claim) != 0 || by != "" {
		t.Fatalf("relay stopped: a claim of %d rows, row claimed by %q; want none", outbox.ClaimLen(claim), by)
	}
}

// TestDirectClaimNeverPublishedIsTakenOverAfterItsLease: the process that
// held a direct claim died before publishing it (Publish never called).
// Another relay publishes the rows once the claim's lease has expired, and
// not before.
func TestDirectClaimNeverPublishedIsTakenOverAfterItsLease(t *testing.T) {
	b := setup(t)
	// Long enough that the dead relay's shutdown, a new relay and its
	// first pass all fit within it on a slow machine.
	const lease = 10 * time.Second
	dead := b.relay(t, outbox.RelayConfig{ID: "dead-relay", Lease: lease, PublishTimeout: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dead.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(dead) })
	claimedAt := time.Now() // claimed_until is the insert's now() + lease
	ids, claim := b.insertClaimed(t, dead, 2, true)
	if outbox.ClaimLen(claim) != 2 {
		t.Fatalf("a claim of %d rows, want 2", outbox.ClaimLen(claim))
	} // and lost with its process: never published
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	other := b.relay(t, outbox.RelayConfig{ID: "other-relay"})
	if got, err := other.DrainOnce(context.Background()); err != nil || got.Claimed != 0 {
		t.Fatalf("within the lease another relay claimed %+v, %v; want nothing", got, err)
	}
	testenv.Eventually(t, 60*time.Second, "the rows published by the other relay", func() bool {
		if _, err := other.DrainOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		return b.count(t, `task_id = ANY($1) AND status = 'SENT' AND claimed_by = 'other-relay'`, ids) == 2
	})
	if since := time.Since(claimedAt); since < lease {
		t.Fatalf("published %s after the claim, before its %s lease expired", since, lease)
	}
	b.checkPublishedOnce(t, 2)
}

// TestStorePublishesThroughItsRelay: a store given a running relay hands
// the tasks CreateBatch commits to it; inside a caller's transaction
// (CreateTx) it cannot, and the rows go the usual way.
func TestStorePublishesThroughItsRelay(t *testing.T) {
	b := setup(t)
	r := b.relay(t, outbox.RelayConfig{ID: "store-relay", PublishInterval: 20 * time.Millisecond})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
	store, err := task.NewStore(b.store.Config(), b.db, task.PublishWith(outbox.NewWriter(r, outbox.PublishClaimed)))
	if err != nil {
		t.Fatal(err)
	}
	b.store = store
	ctx := context.Background()

	res, err := b.store.CreateBatch(ctx, []task.NewTask{
		{Kind: "k", Payload: json.RawMessage(`{"a":1}`)}, {Kind: "k", Payload: json.RawMessage(`{"a":2}`)}})
	if err != nil {
		t.Fatal(err)
	}
	direct := []uuid.UUID{res[0].Task.ID, res[1].Task.ID}
	testenv.Eventually(t, 30*time.Second, "the batch published", func() bool {
		return b.count(t, `task_id = ANY($1) AND status = 'SENT'`, direct) == 2
	})
	for id, by := range b.claimedBy(t, direct) {
		if by != "store-relay" {
			t.Errorf("task %s: outbox row claimed by %q, want the store's relay", id, by)
		}
	}

	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inTx, err := b.store.CreateTx(ctx, tx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"a":3}`)})
	if err != nil {
		t.Fatal(err)
	}
	if by := b.claimedBy(t, []uuid.UUID{inTx[0].Task.ID})[inTx[0].Task.ID]; by != "" {
		t.Errorf("CreateTx wrote a row claimed by %q before the caller's commit", by)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the CreateTx task published", func() bool { return b.unsent(t) == 0 })
	b.checkPublishedOnce(t, 3)
}

// createReserved creates n tasks in one transaction through a writer of r
// publishing after commit, committed or rolled back, and returns their ids
// and the claim (ok: whether r took them; when it did not, the writer
// wrote NEW rows in the transaction).
func (b *bundle) createReserved(t *testing.T, r *outbox.Relay, n int, commit bool) (ids []uuid.UUID, claim outbox.Claim, ok bool) {
	t.Helper()
	w := outbox.NewWriter(r, outbox.PublishAfterCommit)
	ids = b.taskTx(t, n, "reserved", commit, func(tx pgx.Tx, ids []uuid.UUID) {
		var err error
		if claim, err = w.StageCreated(context.Background(), tx, b.messages(ids, "reserved")); err != nil {
			t.Fatal(err)
		}
	})
	return ids, claim, outbox.ClaimLen(claim) > 0
}

// TestReservePublishesAfterCommit: tasks reserved with a running relay
// have no outbox row until they are published; once the claim is handed
// over, the relay XADDs them and writes each task's one row, SENT with its
// entry id (the rows never pass through NEW, so no relay pass can claim
// them). A discarded reservation frees its slot and writes nothing.
func TestReservePublishesAfterCommit(t *testing.T) {
	b := setup(t)
	r := b.relay(t, outbox.RelayConfig{ID: "after-commit", PublishInterval: time.Hour, DirectBacklog: 2})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })

	ids, claim, ok := b.createReserved(t, r, 3, true)
	if !ok || outbox.ClaimLen(claim) != 3 {
		t.Fatalf("Reserve with a running relay: ok %v, %d rows; want 3", ok, outbox.ClaimLen(claim))
	}
	if n := b.count(t, `task_id = ANY($1)`, ids); n != 0 {
		t.Fatalf("%d outbox rows before the claim was published, want none", n)
	}
	claim.Publish()
	testenv.Eventually(t, 30*time.Second, "the tasks published with SENT rows", func() bool {
		return b.count(t, `task_id = ANY($1) AND status = 'SENT' AND sent_at IS NOT NULL AND attempt_count = 0`, ids) == 3
	})
	b.checkPublishedOnce(t, 3)
	if got := publishTotal(t, b, "success"); got != 3 {
		t.Errorf("publish total = %v, want 3", got)
	}

	// DirectBacklog is 2: two discarded reservations leave room for two
	// more, and the rolled-back tasks have neither rows nor entries.
	for range 2 {
		_, c, ok := b.createReserved(t, r, 1, false)
		if !ok {
			t.Fatal("Reserve refused with free slots")
		}
		c.Discard()
	}
	var claims []outbox.Claim
	for range 2 {
		_, c, ok := b.createReserved(t, r, 1, true)
		if !ok {
			t.Fatal("after discards, Reserve found no room: the slots were not freed")
		}
		claims = append(claims, c)
	}
	if _, _, ok := b.createReserved(t, r, 1, false); ok {
		t.Fatal("Reserve took a third claim with a backlog of 2")
	}
	for _, c := range claims {
		c.Publish()
	}
	testenv.Eventually(t, 30*time.Second, "both published", func() bool { return b.count(t, `status = 'SENT'`) == 5 })
	b.checkPublishedOnce(t, 5)
}

// TestReserveRefusedWhenNotRunning: a relay that is not running takes no
// reservation (the caller then writes NEW rows), nor does one that has
// stopped.
func TestReserveRefusedWhenNotRunning(t *testing.T) {
	b := setup(t)
	r := b.relay(t, outbox.RelayConfig{ID: "stopped"})
	if _, c, ok := b.createReserved(t, r, 1, false); ok || outbox.ClaimLen(c) != 0 {
		t.Fatalf("Reserve on a relay that never ran: ok %v, %d rows", ok, outbox.ClaimLen(c))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, _, ok := b.createReserved(t, r, 1, false); ok {
		t.Fatal("Reserve on a stopped relay took the tasks")
	}
}

// TestReserveFailedPublishWritesRetryingRows: when the XADD of reserved
// tasks fails, the relay writes their rows RETRYING after one failed
// attempt, with the error and a backoff, unclaimed, so that the relays'
// passes publish them once Redis is back; with MaxAttempts 1 they are
// DEAD at once (no retry time), for the rescuer.
func TestReserveFailedPublishWritesRetryingRows(t *testing.T) {
	for _, c := range []struct {
		name        string
		maxAttempts int
		where       string
		result      string
	}{
		{"Retrying", 5, `status = 'RETRYING' AND next_retry_at > now() + interval '200 milliseconds'`, "failure"},
		{"Dead", 1, `status = 'DEAD' AND next_retry_at IS NULL`, "dead"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, rdb := newDedicatedRedis(t)
			b := setupWith(t, rdb)
			r := b.relay(t, outbox.RelayConfig{ID: "failing", PublishInterval: time.Hour, MaxAttempts: c.maxAttempts,
				PublishTimeout: time.Second, Backoff: backoff.Policy{Base: 30 * time.Second, Max: time.Minute, Jitter: 0.1}})
			run(t, r.Run)
			testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
			s.Kill()
			ids, claim, ok := b.createReserved(t, r, 4, true)
			if !ok {
				t.Fatal("Reserve refused")
			}
			claim.Publish()
			testenv.Eventually(t, 10*time.Second, "the failed rows written", func() bool {
				return b.count(t, `task_id = ANY($1)`, ids) == 4
			})
			if got := b.count(t, `task_id = ANY($1) AND attempt_count = 1 AND last_error LIKE '%xadd%'
				AND claimed_by IS NULL AND sent_at IS NULL AND `+c.where, ids); got != 4 {
				t.Fatalf("%d of 4 rows are %s after one failed attempt with the error", got, c.name)
			}
			if got := publishTotal(t, b, c.result); got != 4 {
				t.Errorf("outbox_publish_total{result=%s} = %v, want 4", c.result, got)
			}
		})
	}
}

// TestStorePublishesAfterCommit: a store publishing after commit creates
// tasks whose only outbox row is the SENT one its relay writes after the
// XADD; a delayed task, and a task created in the caller's transaction,
// still get their NEW row in the transaction.
func TestStorePublishesAfterCommit(t *testing.T) {
	b := setup(t)
	r := b.relay(t, outbox.RelayConfig{ID: "store-relay", PublishInterval: 20 * time.Millisecond})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
	store, err := task.NewStore(b.store.Config(), b.db, task.PublishWith(outbox.NewWriter(r, outbox.PublishAfterCommit)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := store.CreateBatch(ctx, []task.NewTask{
		{Kind: "k", Payload: json.RawMessage(`{"a":1}`)}, {Kind: "k", Payload: json.RawMessage(`{"a":2}`)},
		{Kind: "k", Payload: json.RawMessage(`{"a":3}`), Delay: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	now := []uuid.UUID{res[0].Task.ID, res[1].Task.ID}
	testenv.Eventually(t, 30*time.Second, "the batch published", func() bool {
		return b.count(t, `task_id = ANY($1) AND status = 'SENT'`, now) == 2
	})
	if n := b.count(t, `task_id = ANY($1) AND claimed_by IS NOT NULL`, now); n != 0 {
		t.Errorf("%d rows of tasks published after commit were claimed: they must be written once, SENT", n)
	}
	if n := b.count(t, `task_id = $1 AND status = 'NEW' AND next_retry_at > now() + interval '50 minutes'`, res[2].Task.ID); n != 1 {
		t.Errorf("the delayed task has %d NEW rows due in an hour, want 1", n)
	}

	tx, err := b.db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inTx, err := store.CreateTx(ctx, tx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"a":4}`)})
	if err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, `task_id = $1`, inTx[0].Task.ID); n != 0 {
		t.Fatalf("another transaction sees %d rows of the uncommitted task", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the CreateTx task published", func() bool {
		return b.count(t, `task_id = $1 AND status = 'SENT' AND claimed_by IS NOT NULL`, inTx[0].Task.ID) == 1
	})
	if got := len(b.entries(t)); got != 3 {
		t.Errorf("%d stream entries, want 3 (the delayed task is not due)", got)
	}
}
