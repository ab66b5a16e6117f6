package task_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestPauseParksAndResumeReleases: only due waiting tasks of a paused kind
// are parked; a parked task does not start; a resume makes every parked
// task due with a new outbox event, and both changes are recorded with
// the actor.
func TestPauseParksAndResumeReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	a1, a2 := b.create(t, task.NewTask{Kind: "a"}).ID, b.create(t, task.NewTask{Kind: "a"}).ID
	aLater := b.create(t, task.NewTask{Kind: "a", Delay: time.Hour}).ID
	other := b.create(t, task.NewTask{Kind: "b"}).ID

	if parked, err := b.store.Park(b.ctx, a1, a2, aLater, other); err != nil || len(parked) != 0 {
		t.Fatalf("Park with nothing paused = %v, %v; want nothing parked", parked, err)
	}
	if _, err := b.store.SetPaused(b.ctx, "api:test", "a", true); err != nil {
		t.Fatal(err)
	}
	limits, err := b.store.KindLimits(b.ctx)
	if err != nil || len(limits) != 1 || !limits["a"].Paused || limits["a"].Limited() {
		t.Fatalf("KindLimits = %v, %v; want a paused only", limits, err)
	}
	parked, err := b.store.Park(b.ctx, a1, a2, aLater, other)
	if err != nil || len(parked) != 2 {
		t.Fatalf("Park = %v, %v; want the two due tasks of a", parked, err)
	}
	for _, id := range []uuid.UUID{a1, a2} {
		tk := b.get(t, id)
		if !tk.Parked() || tk.Status != task.Queued {
			t.Fatalf("task %s: %s next_retry_at %v, want QUEUED and parked", id, tk.Status, tk.NextRetryAt)
		}
		b.start(t, "w", time.Minute, id, task.Parked)
	}
	if b.get(t, aLater).Parked() || b.get(t, other).Parked() {
		t.Fatal("a delayed task or a task of another kind was parked")
	}

	released, err := b.store.SetPaused(b.ctx, "cli:test", "a", false)
	if err != nil || released != 2 {
		t.Fatalf("resume = %d, %v; want 2 released", released, err)
	}
	for _, id := range []uuid.UUID{a1, a2} {
		if tk := b.get(t, id); tk.Parked() || tk.NextRetryAt != nil {
			t.Fatalf("task %s after the resume: next_retry_at %v, want due", id, tk.NextRetryAt)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id); n != 2 {
			t.Fatalf("task %s has %d outbox events, want 2 (create and resume)", id, n)
		}
		b.start(t, "w", time.Minute, id, task.Started)
	}
	if n := b.count(t, `SELECT count(*) FROM ingest_kind_change WHERE kind = 'a' AND ((actor = 'api:test' AND paused) OR (actor = 'cli:test' AND NOT paused AND released = 2))`); n != 2 {
		t.Fatalf("%d matching kind changes, want the pause and the resume", n)
	}
	kinds, err := b.store.Kinds(b.ctx)
	if err != nil || len(kinds) != 2 || kinds[0].Kind != "a" || kinds[0].Paused || kinds[0].Running != 2 ||
		kinds[0].Counts[task.Running] != 2 || kinds[0].Counts[task.Queued] != 1 || kinds[0].UpdatedBy != "cli:test" ||
		kinds[1].Kind != "b" || kinds[1].Counts[task.Queued] != 1 {
		t.Fatalf("Kinds = %+v, %v", kinds, err)
	}
	for _, bad := range []string{"", " ", string(make([]byte, task.MaxKindLength+1))} {
		if _, err := b.store.SetPaused(b.ctx, "x", bad, true); err == nil {
			t.Errorf("SetPaused(%q) accepted", bad)
		}
	}
}

// TestParkRacesResume: workers park a kind's tasks while an operator
// resumes it; afterwards no task is left parked (a park either saw the
// resume and parked nothing, or committed first and was released).
func TestParkRacesResume(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	for round := range 20 {
		kind := "race-" + string(rune('a'+round))
		var ids []uuid.UUID
		for range 20 {
			ids = append(ids, b.create(t, task.NewTask{Kind: kind}).ID)
		}
		if _, err := b.store.SetPaused(b.ctx, "t", kind, true); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				if _, err := b.store.Park(b.ctx, ids[i*5:(i+1)*5]...); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Go(func() {
			if _, err := b.store.SetPaused(b.ctx, "t", kind, false); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if n := b.count(t, `SELECT count(*) FROM ingest_task WHERE kind = $1 AND parked_at IS NOT NULL`, kind); n != 0 {
			t.Fatalf("round %d: %d tasks left parked after the resume", round, n)
		}
	}
}

// TestFarScheduleIsNotParked: a task scheduled far ahead is a scheduled
// task, not a parked one, whatever its due time: it is not counted as
// parked, a pause does not park it (it is not due) and a resume does not
// run it early. One is scheduled at the horizon, the other by SQL at the
// former parked mark (9999-12-31), which a run_at could hold before the
// horizon.
func TestFarScheduleIsNotParked(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	atHorizon := b.create(t, task.NewTask{Kind: "far", RunAt: time.Now().Add(task.ScheduleHorizon - time.Minute)}).ID
	far := b.create(t, task.NewTask{Kind: "far", Delay: time.Hour}).ID
	if _, err := b.db.Exec(b.ctx, `UPDATE ingest_task SET next_retry_at = '9999-12-31 00:00:00+00' WHERE id = $1`, far); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(b.ctx, `UPDATE outbox_event SET next_retry_at = '9999-12-31 00:00:00+00' WHERE task_id = $1`, far); err != nil {
		t.Fatal(err)
	}
	due := b.create(t, task.NewTask{Kind: "far"}).ID
	scheduled := []uuid.UUID{atHorizon, far}
	for _, id := range scheduled {
		if tk := b.get(t, id); tk.Parked() || tk.ParkedNote() != "" {
			t.Fatalf("a task scheduled for %v reads as parked: %+v", tk.NextRetryAt, tk)
		}
	}
	k, _, err := b.store.Kind(b.ctx, "far")
	if err != nil || k.Parked != 0 {
		t.Fatalf("Kind(far) = %+v, %v; want no parked task", k, err)
	}

	if _, err := b.store.SetPaused(b.ctx, "t", "far", true); err != nil {
		t.Fatal(err)
	}
	parked, err := b.store.Park(b.ctx, atHorizon, far, due)
	if err != nil || len(parked) != 1 || parked[0] != due {
		t.Fatalf("Park = %v, %v; want only the due task %s", parked, err, due)
	}
	if k, _, err = b.store.Kind(b.ctx, "far"); err != nil || k.Parked != 1 {
		t.Fatalf("Kind(far) while paused = %+v, %v; want 1 parked", k, err)
	}
	if tk := b.get(t, due); !tk.Parked() || tk.ParkedAt == nil || tk.ParkedReason != task.ParkedPaused || tk.ParkedNote() != "parked (kind paused)" {
		t.Fatalf("the parked task reads %+v (%q); want parked, reason paused", tk, tk.ParkedNote())
	}
	released, err := b.store.SetPaused(b.ctx, "t", "far", false)
	if err != nil || released != 1 {
		t.Fatalf("resume = %d, %v; want the one parked task released", released, err)
	}
	for _, id := range scheduled {
		tk := b.get(t, id)
		if tk.Parked() || tk.NextRetryAt == nil || tk.NextRetryAt.Before(time.Now().Add(task.ScheduleHorizon/2)) {
			t.Fatalf("a far task after pause and resume: %+v; want still scheduled far ahead", tk)
		}
		if n := b.count(t, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id); n != 1 {
			t.Fatalf("a far task has %d outbox events after the resume, want its own one", n)
		}
		b.start(t, "w", time.Minute, id, task.NotDue)
	}
	b.start(t, "w", time.Minute, due, task.Started)
}
