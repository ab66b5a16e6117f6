package maintenance_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
)

// agedTask creates a task in state st, finished ago (unless st is not
// terminal), its id (a UUIDv7 of its creation time) moved back by ago as
// if it had been created then, with its creation audit and outbox rows.
func (b *bundle) agedTask(t *testing.T, st task.State, ago time.Duration) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	r, err := b.store.Create(ctx, task.NewTask{Kind: "ret", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	old, id := r.Task.ID, r.Task.ID
	ms := uint64(time.Now().Add(-ago).UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	if _, err := b.db.Exec(ctx, `
WITH t AS (UPDATE ingest_task SET id = $2, status = $4,
        finished_at = CASE WHEN $4 IN ('SUCCEEDED', 'CANCELLED', 'DEAD') THEN now() - $3::bigint * interval '1 millisecond' END,
        last_error = CASE WHEN $4 = 'DEAD' THEN 'boom' END,
        cancel_requested_at = CASE WHEN $4 = 'CANCELLED' THEN now() END,
        lease_owner = CASE WHEN $4 = 'RUNNING' THEN 'w' END,
        lease_until = CASE WHEN $4 = 'RUNNING' THEN now() + interval '1 hour' END
    WHERE id = $1),
a AS (UPDATE ingest_task_transition SET task_id = $2 WHERE task_id = $1)
UPDATE outbox_event SET task_id = $2 WHERE task_id = $1`, old, id, ago.Milliseconds(), string(st)); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestRetentionDeletesExpiredTasksAndTheirDLQEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, dlqKey := testenv.Keys(t)
	r := b.retention(t, maintenance.RetentionConfig{DisableTrim: true, DLQ: dlqKey, BatchSize: 2,
		Tasks: task.Windows{Succeeded: time.Hour, Cancelled: 2 * time.Hour, Dead: 3 * time.Hour}})

	type tc struct {
		st   task.State
		ago  time.Duration
		gone bool
	}
	cases := []tc{
		{task.Succeeded, 90 * time.Minute, true}, {task.Succeeded, 90 * time.Minute, true}, {task.Succeeded, 30 * time.Minute, false},
		{task.Cancelled, 150 * time.Minute, true}, {task.Cancelled, 90 * time.Minute, false},
		{task.Dead, 200 * time.Minute, true}, {task.Dead, 150 * time.Minute, false},
		{task.Queued, 1000 * time.Hour, false}, {task.Running, 1000 * time.Hour, false}, {task.Retrying, 1000 * time.Hour, false},
	}
	ids := make([]uuid.UUID, len(cases))
	for i, c := range cases {
		ids[i] = b.agedTask(t, c.st, c.ago)
		if c.st == task.Dead {
			if err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: dlqKey, Values: []string{dlq.FieldTaskID, ids[i].String(), "kind", "ret"}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[task.State]int{task.Succeeded: 2, task.Cancelled: 1, task.Dead: 1}
	for st, n := range want {
		if res.Tasks[st] != n {
			t.Errorf("pass deleted %d %s tasks, want %d (result %+v)", res.Tasks[st], st, n, res)
		}
		if got := metricValue(t, b.reg, "ingest_task_retention_deleted_total", "status", string(st)); got != float64(n) {
			t.Errorf("ingest_task_retention_deleted_total{status=%q} = %v, want %d", st, got, n)
		}
	}
	if res.DLQRemoved != 1 {
		t.Errorf("removed %d DLQ entries, want the deleted DEAD task's one", res.DLQRemoved)
	}
	for i, c := range cases {
		n := b.count(t, `task_id = $1`, ids[i]) // outbox rows
		var tasks, audit int
		if err := b.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM ingest_task WHERE id = $1), (SELECT count(*) FROM ingest_task_transition WHERE task_id = $1)`, ids[i]).Scan(&tasks, &audit); err != nil {
			t.Fatal(err)
		}
		// The audit and outbox rows stay until their partition is
		// dropped (partitions.go).
		if c.gone != (tasks == 0) || audit == 0 || n == 0 {
			t.Errorf("%s finished %s ago: task %d, audit %d, outbox %d rows; want gone=%v, its audit and outbox rows kept", c.st, c.ago, tasks, audit, n, c.gone)
		}
	}
	entries, err := b.rdb.XRange(ctx, dlqKey, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Values[dlq.FieldTaskID] != ids[6].String() {
		t.Errorf("DLQ after the pass: %v; want only the kept DEAD task's entry", entries)
	}
	// Nothing more expired: a second pass deletes nothing.
	if res, err := r.RunOnce(ctx); err != nil || len(res.Tasks) != 0 {
		t.Fatalf("second pass: %+v, %v", res, err)
	}
}

func TestRetentionTaskWindowsConfig(t *testing.T) {
	t.Parallel()
	c := maintenance.RetentionConfig{}.WithDefaults()
	if c.Tasks != (task.Windows{Succeeded: 24 * time.Hour, Cancelled: 24 * time.Hour, Dead: 168 * time.Hour}) {
		t.Errorf("default windows %+v", c.Tasks)
	}
	keep := maintenance.RetentionConfig{Tasks: task.Windows{Succeeded: task.KeepForever}}.WithDefaults()
	if keep.Tasks.Succeeded != task.KeepForever {
		t.Errorf("KeepForever became %s", keep.Tasks.Succeeded)
	}
	err := maintenance.Config{Retention: maintenance.RetentionConfig{Tasks: task.Windows{Dead: -time.Hour}}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "Retention.Tasks.Dead") {
		t.Errorf("a negative window: %v; want an error naming Retention.Tasks.Dead", err)
	}
}

// TestRetentionRemovesTheStreamEntriesOfDeletedTasks: the entries of the
// tasks a pass deletes leave the group's pending entries and the stream,
// even though they were still pending (a task cancelled while a worker
// held its entry, a lost XACK), so that no reclaimer claims an entry of
// no task and dead-letters it; the entry of a task kept stays.
func TestRetentionRemovesTheStreamEntriesOfDeletedTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	r := b.retention(t, maintenance.RetentionConfig{DisableTrim: true,
		Tasks: task.Windows{Succeeded: time.Hour, Cancelled: time.Hour, Dead: time.Hour}})
	cancelled := b.agedTask(t, task.Cancelled, 2*time.Hour)
	succeeded := b.agedTask(t, task.Succeeded, 2*time.Hour)
	kept := b.agedTask(t, task.Succeeded, 30*time.Minute)
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, stream.DefaultGroup, "0").Err(); err != nil {
		t.Fatal(err)
	}
	b.publishAll(t)
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: stream.DefaultGroup, Consumer: "gone",
		Streams: []string{b.stream, ">"}, Count: 10, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	keptEntry := b.entryOf(t, kept)
	if p, err := b.rdb.XPending(ctx, b.stream, stream.DefaultGroup).Result(); err != nil || p.Count != 3 {
		t.Fatalf("pending before the pass: %+v, %v; want the 3 tasks' entries", p, err)
	}

	res, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tasks[task.Cancelled] != 1 || res.Tasks[task.Succeeded] != 1 || res.EntriesRemoved != 2 {
		t.Errorf("pass: %+v; want %s and %s deleted with their 2 entries", res, cancelled, succeeded)
	}
	ps, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.stream, Group: stream.DefaultGroup, Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(ps) != 1 || ps[0].ID != keptEntry {
		t.Errorf("pending after the pass: %v, %v; want only the kept task's entry %s", ps, err, keptEntry)
	}
	if got := b.entries(t); len(got) != 1 || got[keptEntry] != kept.String() {
		t.Errorf("stream after the pass: %v; want only the kept task's entry %s", got, keptEntry)
	}
}
