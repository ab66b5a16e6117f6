package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// outboxRow is what the writer tests look at of a task's outbox rows.
type outboxRow struct {
	status, claimedBy string
}

// rowsOf returns the outbox rows of task id, oldest first.
func (b *bundle) rowsOf(t *testing.T, id uuid.UUID) []outboxRow {
	t.Helper()
	rows, err := b.db.Query(context.Background(),
		`SELECT status, coalesce(claimed_by, '') FROM outbox_event WHERE task_id = $1 ORDER BY id`, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		return o, r.Scan(&o.status, &o.claimedBy)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// heldRelay returns a running relay (no passes but the first, within the
// test) that stops every publish after its XADD, before it writes or marks
// the rows, until the test lets it go on: published receives once per
// publish that reached that point, and closing the returned func releases
// every held and later publish.
func (b *bundle) heldRelay(t *testing.T, id string) (r *outbox.Relay, published <-chan struct{}, release func()) {
	t.Helper()
	r = b.relay(t, outbox.RelayConfig{ID: id, PublishInterval: time.Hour})
	reached := make(chan struct{}, 16)
	gate := make(chan struct{})
	outbox.SetAfterPublish(r, func() {
		reached <- struct{}{}
		<-gate
	})
	var released bool
	release = func() {
		if !released {
			released = true
			close(gate)
		}
	}
	run(t, r.Run)
	t.Cleanup(release) // registered last, so it runs before run's cleanup stops the relay
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
	return r, reached, release
}

// TestWriterDecidesThePublishingPath: the same Create, through stores that
// differ only in their outbox.Writer, leaves the rows each path promises:
// the zero Writer a NEW row for the NOTIFY-woken relays; PublishClaimed a
// row claimed by the running relay, marked SENT once published;
// PublishAfterCommit no row at all until the relay has published the
// task, then one SENT row it never claimed. Tasks that existed before the
// transaction (Stage) get a claimed row in either mode, and a relay that
// is not running is not used.
func TestWriterDecidesThePublishingPath(t *testing.T) {
	create := func(t *testing.T, b *bundle, w outbox.Writer) uuid.UUID {
		t.Helper()
		store, err := task.NewStore(b.store.Config(), b.db, task.PublishWith(w))
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.Create(context.Background(), task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		return res.Task.ID
	}
	want := func(t *testing.T, b *bundle, id uuid.UUID, what string, rows ...outboxRow) {
		t.Helper()
		got := b.rowsOf(t, id)
		if len(got) != len(rows) {
			t.Fatalf("%s: outbox rows %+v, want %+v", what, got, rows)
		}
		for i := range rows {
			if got[i] != rows[i] {
				t.Fatalf("%s: outbox rows %+v, want %+v", what, got, rows)
			}
		}
	}

	t.Run("NoRelay", func(t *testing.T) {
		b := setup(t)
		id := create(t, b, outbox.Writer{})
		want(t, b, id, "after the commit", outboxRow{status: "NEW"})
	})

	t.Run("Claimed", func(t *testing.T) {
		b := setup(t)
		r, published, release := b.heldRelay(t, "claimed-relay")
		id := create(t, b, outbox.NewWriter(r, outbox.PublishClaimed))
		<-published
		want(t, b, id, "published, not yet marked", outboxRow{status: "NEW", claimedBy: "claimed-relay"})
		release()
		testenv.Eventually(t, 10*time.Second, "the row marked SENT", func() bool { return b.count(t, `status = 'SENT'`) == 1 })
		want(t, b, id, "marked", outboxRow{status: "SENT", claimedBy: "claimed-relay"})
		b.checkPublishedOnce(t, 1)
	})

	t.Run("AfterCommit", func(t *testing.T) {
		b := setup(t)
		r, published, release := b.heldRelay(t, "after-commit-relay")
		id := create(t, b, outbox.NewWriter(r, outbox.PublishAfterCommit))
		<-published
		want(t, b, id, "published, not yet written")
		if got := len(b.entries(t)); got != 1 {
			t.Fatalf("%d stream entries once published, want 1", got)
		}
		release()
		testenv.Eventually(t, 10*time.Second, "the row written", func() bool { return b.count(t, `true`) == 1 })
		want(t, b, id, "written", outboxRow{status: "SENT"})
		b.checkPublishedOnce(t, 1)
	})

	t.Run("AfterCommitExistingTasks", func(t *testing.T) {
		b := setup(t)
		r, published, release := b.heldRelay(t, "existing-relay")
		w := outbox.NewWriter(r, outbox.PublishAfterCommit)
		var claim outbox.Claim
		ids := b.taskTx(t, 1, "k", true, func(tx pgx.Tx, ids []uuid.UUID) {
			var err error
			if claim, err = w.Stage(context.Background(), tx, b.messages(ids, "k")); err != nil {
				t.Fatal(err)
			}
		})
		want(t, b, ids[0], "committed", outboxRow{status: "NEW", claimedBy: "existing-relay"})
		claim.Publish()
		<-published
		release()
		testenv.Eventually(t, 10*time.Second, "the row marked SENT", func() bool { return b.count(t, `status = 'SENT'`) == 1 })
		b.checkPublishedOnce(t, 1)
	})

	for name, mode := range map[string]outbox.Mode{"Claimed": outbox.PublishClaimed, "AfterCommit": outbox.PublishAfterCommit} {
		t.Run("RelayNotRunning"+name, func(t *testing.T) {
			b := setup(t)
			r := b.relay(t, outbox.RelayConfig{ID: "idle-relay"})
			id := create(t, b, outbox.NewWriter(r, mode))
			want(t, b, id, "after the commit", outboxRow{status: "NEW"})
		})
	}
}
