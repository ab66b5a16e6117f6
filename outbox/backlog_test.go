package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// TestBacklogGaugesCountOnlyDueRows: a delayed task's outbox row is
// scheduled, not backlog, until its time comes: it neither counts in
// outbox_backlog nor ages outbox_backlog_age_seconds (the gauge of the
// critical OutboxBacklogStale alert), however long ago it was written; it
// counts in outbox_scheduled. Once due, it ages from its due time, not from
// its creation. A row whose publish failed is overdue whatever its next
// retry time, and ages from its creation. ReadStats (the CLI's pending)
// reads the same.
func TestBacklogGaugesCountOnlyDueRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.relay(t, outbox.RelayConfig{}) // registers the gauges; not running
	res, err := b.store.CreateBatch(ctx, []task.NewTask{{Kind: "k", Payload: json.RawMessage(`1`), Delay: 15 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	delayed := res[0].Task.ID
	// 65 s after it was created with a delay of 15 minutes.
	b.exec(t, `UPDATE outbox_event SET created_at = created_at - interval '65 seconds', next_retry_at = next_retry_at - interval '65 seconds' WHERE task_id = $1`, delayed)
	b.checkBacklog(t, "a delayed row, 65 s old", 0, 1, 0, 0)

	// Its time came 30 s ago, 16 minutes after it was written.
	b.exec(t, `UPDATE outbox_event SET created_at = now() - interval '16 minutes', next_retry_at = now() - interval '30 seconds' WHERE task_id = $1`, delayed)
	b.checkBacklog(t, "the delayed row due for 30 s", 1, 0, 30, 60)

	// A row created 2 minutes ago whose publish failed, retried in a minute.
	failed := b.create(t, 1)[0]
	b.exec(t, `UPDATE outbox_event SET status = 'RETRYING', attempt_count = 1, created_at = now() - interval '2 minutes',
	    next_retry_at = now() + interval '1 minute' WHERE task_id = $1`, failed)
	b.checkBacklog(t, "and a failed row", 2, 0, 120, 150)
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// checkBacklog checks the gauges and ReadStats: due and scheduled rows, and
// the oldest due row's wait in [minAge, maxAge) seconds.
func (b *bundle) checkBacklog(t *testing.T, what string, due, scheduled int64, minAge, maxAge float64) {
	t.Helper()
	if got := gauge(t, b, "outbox_backlog"); got != float64(due) {
		t.Errorf("%s: outbox_backlog = %v, want %d", what, got, due)
	}
	if got := gauge(t, b, "outbox_scheduled"); got != float64(scheduled) {
		t.Errorf("%s: outbox_scheduled = %v, want %d", what, got, scheduled)
	}
	if age := gauge(t, b, "outbox_backlog_age_seconds"); age < minAge || age >= max(maxAge, 1) {
		t.Errorf("%s: outbox_backlog_age_seconds = %v, want in [%v, %v)", what, age, minAge, max(maxAge, 1))
	}
	s, err := outbox.ReadStats(context.Background(), b.db)
	if err != nil {
		t.Fatal(err)
	}
	if age := s.OldestDue.Seconds(); s.Due != due || s.Scheduled != scheduled || age < minAge || age >= max(maxAge, 1) {
		t.Errorf("%s: ReadStats = %+v, want %d due, %d scheduled, the oldest due for [%v, %v) s", what, s, due, scheduled, minAge, max(maxAge, 1))
	}
}
