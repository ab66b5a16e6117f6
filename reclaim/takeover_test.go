package reclaim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestTakeoverOfExpiredLeasesFromSilentConsumers: with a reclaim idle time
// far away (an hour), a round claims the pending entry of a task RUNNING
// under an expired lease from a consumer silent for a lease, and only that
// one: not the entry of a task whose lease is live, nor of one not started,
// nor of one whose expired lease is this consumer's own (its run may go
// on here), nor any entry of a consumer that was heard from within the
// lease.
func TestTakeoverOfExpiredLeasesFromSilentConsumers(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, be testenv.Backend) {
		const lease = 3 * time.Second
		ctx := context.Background()
		db := testenv.DB(t)
		b := setup(t, be.Client, db, 10, Config{MinIdle: time.Hour, LeaseIdle: lease})
		store, ids := createTasks(t, b, db, 6)
		// Entries 0, 1, 2 and 4 go to "dead", 3 and 5 to "live"; each
		// consumer's heartbeat touches them once.
		dead := b.read(t, "dead", 3)
		live := b.read(t, "live", 1)
		dead = append(dead, b.read(t, "dead", 1)...)
		live = append(live, b.read(t, "live", 1)...)
		b.touch(t, "dead", dead...)
		b.touch(t, "live", live...)
		for _, s := range []struct {
			owner string
			lease time.Duration
			id    uuid.UUID
		}{
			{"dead", time.Millisecond, ids[0]}, // expired: taken over
			{"dead", time.Hour, ids[1]},        // live lease
			{"live", time.Millisecond, ids[3]}, // expired (abandoned), but its consumer is heard from
			{"self", time.Millisecond, ids[4]}, // expired, this consumer's own lease
			{"live", time.Hour, ids[5]},        // running on "live"
		} {
			if _, err := store.Start(ctx, s.owner, s.lease, s.id); err != nil {
				t.Fatal(err)
			}
		}
		testenv.Eventually(t, 30*time.Second, `"dead" silent for a lease`, func() bool {
			cs, err := b.rdb.XInfoConsumers(ctx, b.stream, b.group).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if c.Name == "dead" {
					return c.Idle >= lease
				}
			}
			return false
		})
		b.touch(t, "live", live[1]) // heard from: its heartbeat
		res := b.r.runOnce(ctx)
		if got := b.sink.ids(); !slices.Equal(got, dead[:1]) || res.TakenOver != 1 {
			t.Fatalf("round %+v handed over %v, want only %v (the expired lease of the silent consumer)", res, got, dead[:1])
		}
		if n := b.counter(t, resultTakeover); n != 1 {
			t.Errorf(`ingest_stream_reclaim_total{result="takeover"} = %v, want 1`, n)
		}
		pel := b.pending(t)
		for id, want := range map[string]string{dead[0]: "self", dead[1]: "dead", dead[2]: "dead", live[0]: "live", dead[3]: "dead", live[1]: "live"} {
			if got := pel[id].Consumer; got != want {
				t.Errorf("entry %s pending with %q, want %q", id, got, want)
			}
		}
		// The next round finds nothing more to take over.
		if res := b.r.runOnce(ctx); res.TakenOver != 0 {
			t.Errorf("second round %+v, want nothing taken over", res)
		}
		b.sink.done(1)
		if got, err := task.ExpiredLeases(ctx, db, "self", ids); err != nil || len(got) != 2 {
			t.Errorf("ExpiredLeases except self's = %v, %v; want the two expired leases of dead and live", got, err)
		}
	})
}

// touch resets the idle time of pending entries for consumer, as its
// heartbeat does (XCLAIM <consumer> 0 ... JUSTID): Redis hears from it.
func (b *bundle) touch(t *testing.T, consumer string, ids ...string) {
	t.Helper()
	args := []any{"XCLAIM", b.stream, b.group, consumer, 0}
	for _, id := range ids {
		args = append(args, id)
	}
	if err := b.rdb.Do(context.Background(), append(args, "JUSTID")...).Err(); err != nil {
		t.Fatalf("XCLAIM as %s: %v", consumer, err)
	}
}

func TestNextID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"1-0":                        "1-1",
		"1700000000000-41":           "1700000000000-42",
		"5-18446744073709551615":     "6-0",
		"0-0":                        "0-1",
		"1526919030474-55":           "1526919030474-56",
		"1526919030474-9":            "1526919030474-10",
		"99999999999999-99999999999": "99999999999999-100000000000",
	} {
		if got := nextID(in); got != want {
			t.Errorf("nextID(%q) = %q, want %q", in, got, want)
		}
	}
}
