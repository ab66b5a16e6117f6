package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
)

// TestRelayDyingMidPassRepublishesAtMostItsBatch: a relay whose session
// dies between its XADDs and the marking (a crash, as far as Postgres can
// tell) leaves its rows as they were, free at once: a relay with a lease of
// an hour publishes them straight away, and only that batch is in the
// stream twice.
func TestRelayDyingMidPassRepublishesAtMostItsBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const rows, batch = 30, 10
	ids := b.create(t, rows)
	cfg := func(id string) outbox.RelayConfig {
		return outbox.RelayConfig{ID: id, BatchSize: batch, Lease: time.Hour, PublishTimeout: 10 * time.Second}
	}
	dying, other := b.relay(t, cfg("dying")), b.relay(t, cfg("other"))
	outbox.SetAfterPublish(dying, func() {
		// The session of the pass ends before it can mark its rows.
		var n int
		if err := b.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'ingest-outbox-pass dying'`).Scan(&n); err != nil || n != 1 {
			t.Errorf("terminating the dying pass's session: %d sessions, %v", n, err)
		}
	})
	res, err := dying.DrainOnce(ctx)
	if err != nil || res.Claimed != batch || res.Published != 0 || res.Stale != batch {
		t.Fatalf("dying relay: %+v, %v; want %d claimed, none published, all stale", res, err, batch)
	}
	if got := b.count(t, `status = 'NEW' AND claimed_by IS NULL AND claimed_until IS NULL`); got != rows {
		t.Fatalf("%d rows NEW and unclaimed after the dying pass, want all %d", got, rows)
	}
	if n := len(b.entries(t)); n != batch {
		t.Fatalf("%d entries after the dying pass, want its %d", n, batch)
	}
	for {
		res, err := other.DrainOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Claimed == 0 {
			break
		}
	}
	if got := b.count(t, `status = 'SENT' AND claimed_by = 'other'`); got != rows {
		t.Fatalf("%d rows SENT by the other relay, want %d", got, rows)
	}
	perTask := map[string]int{}
	for _, id := range b.entries(t) {
		perTask[id]++
	}
	twice := 0
	for _, id := range ids {
		switch perTask[id.String()] {
		case 1:
		case 2:
			twice++
		default:
			t.Errorf("task %s has %d entries", id, perTask[id.String()])
		}
	}
	if twice != batch {
		t.Errorf("%d tasks published twice, want the dying pass's %d", twice, batch)
	}
}

// TestRelayPassHoldsNoRowOnceDone: after a pass, whatever its outcome, its
// connection is back in the pool with no transaction open and no row
// locked: another transaction can lock every row at once.
func TestRelayPassHoldsNoRowOnceDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.create(t, 5)
	r := b.relay(t, outbox.RelayConfig{ID: "r", BatchSize: 3})
	if res, err := r.DrainOnce(ctx); err != nil || res.Published != 3 {
		t.Fatalf("DrainOnce = %+v, %v; want 3 published", res, err)
	}
	var open int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil || open != 0 {
		t.Fatalf("%d sessions idle in a transaction after the pass (%v), want 0", open, err)
	}
	var locked int
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM outbox_event FOR UPDATE NOWAIT) s`).Scan(&locked); err != nil || locked != 5 {
		t.Fatalf("locking every row after the pass: %d, %v; want 5, no error", locked, err)
	}
	testenv.Eventually(t, 10*time.Second, "the rest published", func() bool {
		res, err := r.DrainOnce(ctx)
		return err == nil && res.Claimed == 0 && b.unsent(t) == 0
	})
}
