package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/outbox"
)

// listener LISTENs on the relays' channel on a connection of its own.
type listener struct {
	t    *testing.T
	conn *pgxpool.Conn
	db   *pgxpool.Pool
	n    int
}

func (b *bundle) listen(t *testing.T) *listener {
	t.Helper()
	conn, err := b.db.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), `UNLISTEN *`)
		conn.Release()
	})
	if _, err := conn.Exec(context.Background(), `LISTEN `+pgx.Identifier{outbox.NotifyChannel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return &listener{t: t, conn: conn, db: b.db}
}

// announced reports whether what committed since the last call sent a
// notification on the channel: it sends a marker of its own, committed
// after all of that, and reads the notifications up to the marker
// (notifications arrive in commit order).
func (l *listener) announced() bool {
	l.t.Helper()
	l.n++
	marker := fmt.Sprintf("marker-%d", l.n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.db.Exec(ctx, `SELECT pg_notify($1, $2)`, outbox.NotifyChannel, marker); err != nil {
		l.t.Fatal(err)
	}
	got := false
	for {
		n, err := l.conn.Conn().WaitForNotification(ctx)
		if err != nil {
			l.t.Fatalf("waiting for %s: %v", marker, err)
		}
		if n.Payload == marker {
			return got
		}
		got = true
	}
}

// TestOutboxNotifiesOnlyRowsToFind: the NOTIFY that wakes the relays is
// sent for a statement that writes an unsent row no relay has claimed (a
// new row, a delayed one, a failed publish due again), and not for rows no
// relay needs to look for: a task published directly after its commit
// (its row inserted SENT), a row claimed in its creating transaction by
// the process's own relay, a DEAD row. Each of those used to wake every
// relay for a claim that found nothing.
func TestOutboxNotifiesOnlyRowsToFind(t *testing.T) {
	b := setup(t)
	l := b.listen(t)
	ctx := context.Background()

	for _, c := range []struct {
		name   string
		insert string // one statement; $1 the tasks, $2 the stream
		want   bool
	}{
		{"new", `INSERT INTO outbox_event (task_id, stream) SELECT id, $2 FROM unnest($1::uuid[]) AS t(id)`, true},
		{"delayed", `INSERT INTO outbox_event (task_id, stream, next_retry_at) SELECT id, $2, now() + interval '1 hour' FROM unnest($1::uuid[]) AS t(id)`, true},
		{"retrying", `INSERT INTO outbox_event (task_id, stream, status, attempt_count, last_error) SELECT id, $2, 'RETRYING', 1, 'boom' FROM unnest($1::uuid[]) AS t(id)`, true},
		{"sent", `INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at) SELECT id, $2, 'SENT', '1-' || ord, now() FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, ord)`, false},
		{"claimed", `INSERT INTO outbox_event (task_id, stream, claimed_by, claimed_until) SELECT id, $2, 'r', now() + interval '1 minute' FROM unnest($1::uuid[]) AS t(id)`, false},
		{"dead", `INSERT INTO outbox_event (task_id, stream, status, attempt_count, last_error) SELECT id, $2, 'DEAD', 5, 'boom' FROM unnest($1::uuid[]) AS t(id)`, false},
		{"sent and new together", `INSERT INTO outbox_event (task_id, stream, status, stream_id, sent_at)
			SELECT id, $2, CASE WHEN ord = 3 THEN 'NEW' ELSE 'SENT' END, CASE WHEN ord = 3 THEN NULL ELSE '1-' || ord END, CASE WHEN ord = 3 THEN NULL ELSE now() END
			FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, ord)`, true},
	} {
		b.taskTx(t, 3, "notify", true, func(tx pgx.Tx, ids []uuid.UUID) {
			if _, err := tx.Exec(ctx, c.insert, ids, b.stream); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		})
		if got := l.announced(); got != c.want {
			t.Errorf("%s rows: notified %v, want %v", c.name, got, c.want)
		}
	}

	// The paths themselves: a task published directly after its commit
	// wakes no relay; one written NEW by a writer without a running relay
	// does.
	r := b.relay(t, outbox.RelayConfig{ID: "notify", PublishInterval: time.Hour})
	run(t, r.Run)
	testenv.Eventually(t, 10*time.Second, "the relay to run", func() bool { return outbox.Running(r) })
	ids, claim, ok := b.createReserved(t, r, 3, true)
	if !ok {
		t.Fatal("Reserve refused with a running relay")
	}
	claim.Publish()
	testenv.Eventually(t, 30*time.Second, "the tasks published with SENT rows", func() bool {
		return b.count(t, `task_id = ANY($1) AND status = 'SENT'`, ids) == 3
	})
	if l.announced() {
		t.Error("a task published directly after its commit notified the relays")
	}
	b.taskTx(t, 2, "notify", true, func(tx pgx.Tx, ids []uuid.UUID) {
		if _, err := (outbox.Writer{}).StageCreated(ctx, tx, b.messages(ids, "notify")); err != nil {
			t.Fatal(err)
		}
	})
	if !l.announced() {
		t.Error("tasks written NEW in their transaction did not notify the relays")
	}
}
