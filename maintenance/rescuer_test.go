package maintenance_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/stream"
)

const group = stream.DefaultGroup

func (b *bundle) rescuer(t *testing.T, cfg maintenance.RescuerConfig) *maintenance.Rescuer {
	t.Helper()
	if cfg.Stream == "" {
		cfg.Stream = b.stream
	}
	r, err := maintenance.NewRescuer(cfg, b.db, b.rdb, b.reg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRescuerRepublishesTasksWhoseEntryIsGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	type tc struct {
		state   string
		entry   string // gone (XDEL), pending, undelivered, acked
		extra   string // "unsent": a NEW outbox row besides; "fresh": sent within the grace
		rescued bool
	}
	cases := map[string]tc{
		"QueuedGone":          {state: "QUEUED", entry: "gone", rescued: true},
		"RetryingDueGone":     {state: "RETRYING_DUE", entry: "gone", rescued: true},
		"RetryingNotDueGone":  {state: "RETRYING_LATER", entry: "gone"},
		"RunningExpiredGone":  {state: "RUNNING_EXPIRED", entry: "gone", rescued: true},
		"RunningLiveGone":     {state: "RUNNING_LIVE", entry: "gone"},
		"SucceededGone":       {state: "SUCCEEDED", entry: "gone"},
		"DeadGone":            {state: "DEAD", entry: "gone"},
		"QueuedPending":       {state: "QUEUED", entry: "pending"},
		"RunningExpiredPend":  {state: "RUNNING_EXPIRED", entry: "pending"},
		"QueuedUndelivered":   {state: "QUEUED", entry: "undelivered"},
		"QueuedAcked":         {state: "QUEUED", entry: "acked", rescued: true},
		"QueuedUnsentRowGone": {state: "QUEUED", entry: "gone", extra: "unsent"},
		"QueuedFreshGone":     {state: "QUEUED", entry: "gone", extra: "fresh"},
	}
	// Deliver first (every entry but the undelivered ones, which are added
	// after the read), then shape each case.
	ids := map[string]uuid.UUID{}
	var undelivered []string
	for name, c := range cases {
		if c.entry != "undelivered" {
			ids[name] = b.createAged(t, 1)[0]
		} else {
			undelivered = append(undelivered, name)
		}
	}
	b.publishAll(t)
	if err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{b.stream, ">"}, Count: 1000}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range undelivered {
		ids[name] = b.createAged(t, 1)[0]
	}
	b.publishAll(t)
	b.backdate(t)
	for name, c := range cases {
		id := ids[name]
		b.setState(t, id, c.state)
		sid := b.entryOf(t, id)
		switch c.entry {
		case "gone":
			if err := b.rdb.XDel(ctx, b.stream, sid).Err(); err != nil {
				t.Fatal(err)
			}
		case "acked":
			if err := b.rdb.XAck(ctx, b.stream, group, sid).Err(); err != nil {
				t.Fatal(err)
			}
		}
		switch c.extra {
		case "unsent":
			if err := outbox.Insert(ctx, b.db, b.stream, id); err != nil {
				t.Fatal(err)
			}
		case "fresh":
			b.exec(t, `UPDATE outbox_event SET sent_at = now() WHERE task_id = $1`, id)
		}
	}

	r := b.rescuer(t, maintenance.RescuerConfig{Grace: time.Minute})
	res, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for name, c := range cases {
		all, unsent := b.rows(t, ids[name])
		wantAll, wantUnsent := 1, 0
		if c.rescued {
			want++
			wantAll, wantUnsent = 2, 1
		}
		if c.extra == "unsent" {
			wantAll, wantUnsent = 2, 1
		}
		if all != wantAll || unsent != wantUnsent {
			t.Errorf("%s: %d outbox rows (%d unsent), want %d (%d unsent)", name, all, unsent, wantAll, wantUnsent)
		}
	}
	if res.Rescued != want || res.Missing != want {
		t.Fatalf("RunOnce = %+v; want %d missing and rescued", res, want)
	}
	// Their new rows are unsent: a second pass leaves them alone.
	if res, err := r.RunOnce(ctx); err != nil || res.Rescued != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing rescued", res, err)
	}
	b.publishAll(t)
	for name, c := range cases {
		if c.rescued && !slicesContains(b.entries(t), ids[name].String()) {
			t.Errorf("%s: not republished", name)
		}
	}
	// Freshly republished: within the grace, nothing to do.
	if res, err := r.RunOnce(ctx); err != nil || res.Rescued != 0 {
		t.Fatalf("pass after republishing = %+v, %v; want nothing rescued", res, err)
	}
}

func TestRescuerAfterRedisLosesTheStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, loss := range []string{"FlushAll", "GroupDestroyed"} {
		t.Run(loss, func(t *testing.T) {
			t.Parallel()
			_, rdb := newDedicatedRedis(t)
			b := setupWith(t, rdb)
			if err := rdb.XGroupCreateMkStream(ctx, b.stream, group, "0").Err(); err != nil {
				t.Fatal(err)
			}
			ids := b.createAged(t, 20)
			b.publishAll(t)
			if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c1", Streams: []string{b.stream, ">"}, Count: 5}).Err(); err != nil {
				t.Fatal(err)
			}
			b.backdate(t)
			states := []string{"QUEUED", "RETRYING_DUE", "RUNNING_EXPIRED", "SUCCEEDED", "DEAD"}
			wantRescued := map[uuid.UUID]bool{}
			for i, id := range ids {
				s := states[i%len(states)]
				b.setState(t, id, s)
				wantRescued[id] = s != "SUCCEEDED" && s != "DEAD"
			}
			switch loss {
			case "FlushAll":
				if err := rdb.FlushAll(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			case "GroupDestroyed":
				if err := rdb.XGroupDestroy(ctx, b.stream, group).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// Small pages: the pass walks them with its keyset.
			r := b.rescuer(t, maintenance.RescuerConfig{BatchSize: 2, PagesPerRun: 100})
			res, err := r.RunOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if res.Rescued != 12 {
				t.Fatalf("RunOnce = %+v; want the 12 unfinished tasks rescued", res)
			}
			before := b.entries(t)
			b.publishAll(t)
			entries := b.entries(t)
			for sid := range before {
				delete(entries, sid) // keep what was republished
			}
			for _, id := range ids {
				all, _ := b.rows(t, id)
				if got := slicesContains(entries, id.String()); got != wantRescued[id] || (all == 2) != wantRescued[id] {
					t.Errorf("task %s: republished %v with %d outbox rows; want republished %v", id, got, all, wantRescued[id])
				}
			}
		})
	}
}

func TestRescuerPagesAcrossPasses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	ids := b.createAged(t, 10)
	b.publishAll(t)
	b.backdate(t)
	if err := b.rdb.Del(ctx, b.stream).Err(); err != nil {
		t.Fatal(err)
	}
	// One page of 3 per pass: 10 tasks take 4 passes, then it starts over.
	r := b.rescuer(t, maintenance.RescuerConfig{BatchSize: 3, PagesPerRun: 1})
	var examined []int
	total := 0
	for range 4 {
		res, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		examined = append(examined, res.Examined)
		total += res.Rescued
	}
	if total != 10 || examined[0] != 3 || examined[3] != 1 {
		t.Fatalf("rescued %d over passes examining %v; want 10 over 3,3,3,1", total, examined)
	}
	for _, id := range ids {
		if all, unsent := b.rows(t, id); all != 2 || unsent != 1 {
			t.Errorf("task %s: %d rows, %d unsent; want one new row", id, all, unsent)
		}
	}
}

// TestRescuerRepublishesTaskLeftWithoutOutboxRow: a process publishing
// after commit (outbox.PublishAfterCommit) that dies between its commit and
// its XADD leaves a QUEUED task with no outbox row and no entry. The
// rescuer leaves it alone within the grace (its publisher may still be at
// work) and gives it a row once the grace has passed.
func TestRescuerRepublishesTaskLeftWithoutOutboxRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	if err := b.rdb.XGroupCreateMkStream(ctx, b.stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	id := b.createAged(t, 1)[0]
	b.exec(t, `DELETE FROM outbox_event WHERE task_id = $1`, id) // as if never written
	r := b.rescuer(t, maintenance.RescuerConfig{Grace: time.Minute})
	if res, err := r.RunOnce(ctx); err != nil || res.Rescued != 0 {
		t.Fatalf("within the grace: %+v, %v; want nothing rescued", res, err)
	}
	b.exec(t, `UPDATE ingest_task SET updated_at = now() - interval '2 minutes' WHERE id = $1`, id)
	if res, err := r.RunOnce(ctx); err != nil || res.Rescued != 1 {
		t.Fatalf("after the grace: %+v, %v; want the task rescued", res, err)
	}
	if all, unsent := b.rows(t, id); all != 1 || unsent != 1 {
		t.Fatalf("%d outbox rows (%d unsent), want its new NEW row", all, unsent)
	}
	b.publishAll(t)
	if !slicesContains(b.entries(t), id.String()) {
		t.Fatal("the task was not published")
	}
}
