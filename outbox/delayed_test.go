package outbox_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// TestDelayedRowsWaitForTheirDueTime checks that the outbox row of a
// delayed task is neither published by a relay pass nor claimed by direct
// publishing before its due time, and that the relay's due timer
// publishes it then: the relay polls once an hour, so only the timer can
// publish it before the test's deadline.
func TestDelayedRowsWaitForTheirDueTime(t *testing.T) {
	b := setup(t)
	r := b.relay(t, outbox.RelayConfig{ID: "delay-relay", PublishInterval: time.Hour})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
	store, err := task.NewStore(b.store.Config(), b.db, task.PublishWith(outbox.NewWriter(r, outbox.PublishClaimed)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Long enough for the undelayed task's publishing and a pass to come
	// first on a slow machine.
	const delay = 10 * time.Second
	res, err := store.CreateBatch(ctx, []task.NewTask{
		{Kind: "k", Payload: json.RawMessage(`1`), Delay: delay},
		{Kind: "k", Payload: json.RawMessage(`2`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	delayed, now := res[0].Task, res[1].Task
	testenv.Eventually(t, 30*time.Second, "the undelayed task published", func() bool {
		return b.count(t, `task_id = $1 AND status = 'SENT'`, now.ID) == 1
	})
	if by := b.claimedBy(t, []uuid.UUID{delayed.ID})[delayed.ID]; by != "" {
		t.Fatalf("direct publishing claimed the delayed row (by %q)", by)
	}
	// Passes run meanwhile (the NOTIFY of the insert, the undelayed
	// task's own publishing); one more, explicit, must not take it either.
	if _, err := r.DrainOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(b.entries(t)); n != 1 {
		t.Fatalf("%d stream entries before the delayed task is due, want 1 (the undelayed task's)", n)
	}
	due := *delayed.NextRetryAt
	var sentAt time.Time
	testenv.Eventually(t, 60*time.Second, "the delayed task published", func() bool {
		return b.db.QueryRow(ctx, `SELECT sent_at FROM outbox_event WHERE task_id = $1 AND status = 'SENT'`, delayed.ID).Scan(&sentAt) == nil
	})
	if sentAt.Before(due) {
		t.Fatalf("the delayed row was published at %v, before its due time %v", sentAt, due)
	}
	// A pass came before the due time and set the relay's timer for it:
	// the row is published at its due time (logged), not at the next poll,
	// an hour away.
	t.Logf("the delayed row was published %s after its due time", sentAt.Sub(due))
	if n := len(b.entries(t)); n != 2 {
		t.Fatalf("%d stream entries, want 2 (one per task)", n)
	}
	b.checkPublishedOnce(t, 2)
	// The publish delay of the delayed row counts from its due time: both
	// rows together took less than the delay itself.
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	var count uint64
	for _, mf := range mfs {
		if mf.GetName() == "outbox_publish_delay_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			sum, count = h.GetSampleSum(), h.GetSampleCount()
		}
	}
	if count != 2 || sum >= delay.Seconds() {
		t.Errorf("outbox_publish_delay_seconds: %d samples summing to %.3fs; want 2, under the delay of %s", count, sum, delay)
	}
}

// TestDelayedRowsDueTogetherArePublishedAtTheirDueTime: ten delayed rows
// due within a few milliseconds of each other are all published at their
// due time by the relay's due timer, although the relay polls only once an
// hour: the timer is re-armed from the earliest unpublished row after
// every pass, whatever woke it (here the NOTIFY of their insert, then the
// timer itself), including rows that fell due while the pass ran (its
// publish is slowed to make sure the rest of the group falls due then).
func TestDelayedRowsDueTogetherArePublishedAtTheirDueTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.relay(t, outbox.RelayConfig{PublishInterval: time.Hour})
	var once sync.Once
	outbox.SetAfterPublish(r, func() { once.Do(func() { time.Sleep(100 * time.Millisecond) }) })
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay's first pass", func() bool { return outbox.Running(r) })
	const n = 10
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	// Task rows for the claim's join, and their outbox rows due 1.5 s from
	// now, 2 ms apart, in one transaction: one NOTIFY.
	b.exec(t, `INSERT INTO ingest_task (id, kind, payload, payload_sha, max_attempts)
	    SELECT id, 'k', '{}', 'sha', 3 FROM unnest($1::uuid[]) AS id`, ids)
	b.exec(t, `INSERT INTO outbox_event (task_id, stream, next_retry_at)
	    SELECT id, $2, now() + interval '1500 milliseconds' + (ord * interval '2 milliseconds')
	    FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, ord)`, ids, b.stream)
	testenv.Eventually(t, 60*time.Second, "all ten rows published", func() bool {
		return b.count(t, `status = 'SENT'`) == n
	})
	rows, err := b.db.Query(ctx, `SELECT extract(epoch FROM sent_at - next_retry_at)::float8 FROM outbox_event ORDER BY next_retry_at`)
	if err != nil {
		t.Fatal(err)
	}
	lates, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	if err != nil {
		t.Fatal(err)
	}
	for i, late := range lates {
		// Generous for a loaded machine, and an hour below the poll.
		if late < 0 || late > 10 {
			t.Errorf("row %d published %.3fs after its due time, want within [0, 10)s", i, late)
		}
	}
	t.Logf("published after their due time (s): %.3f", lates)
	b.checkPublishedOnce(t, n)
}
