package dlq_test

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
	"github.com/ingest-worker/ingest/task"
)

const group = "ingest-workers"

// pendingEntry adds an entry to key and delivers it, so it is pending.
func pendingEntry(t *testing.T, rdb *redis.Client, key string, values ...any) string {
	t.Helper()
	ctx := context.Background()
	if err := rdb.XGroupCreateMkStream(ctx, key, group, "$").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		t.Fatal(err)
	}
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: values}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{key, ">"}, Count: 100, Block: -1}).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

func pending(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), key, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

func TestWriter(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, dlqKey := testenv.Keys(t)
		w, err := dlq.NewWriter(dlq.Config{Stream: key, Group: group, DLQ: dlqKey}, b.Client)
		if err != nil {
			t.Fatal(err)
		}
		taskID := uuid.NewString()
		src := pendingEntry(t, b.Client, key, "task_id", taskID, "kind", "k")
		deadAt := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		e := dlq.Entry{TaskID: taskID, Kind: "k", AttemptCount: 3, LastError: "boom", SourceID: src, DeadAt: deadAt}

		// A DLQ key of the wrong type: nothing is acknowledged.
		if err := b.Client.Set(ctx, dlqKey, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(ctx, e); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("Write to a string key: %v, want WRONGTYPE", err)
		}
		if pending(t, b.Client, key) != 1 {
			t.Fatal("the source entry was acknowledged although the XADD failed")
		}
		b.Client.Del(ctx, dlqKey)

		id, err := w.Write(ctx, e)
		if err != nil || id == "" {
			t.Fatalf("Write: %q %v", id, err)
		}
		if pending(t, b.Client, key) != 0 {
			t.Error("source entry still pending")
		}
		// Repeated (a retry after a lost reply): no second entry.
		if id2, err := w.Write(ctx, e); err != nil || id2 != "" {
			t.Errorf("second Write: %q %v, want nothing written", id2, err)
		}
		got, err := dlq.List(ctx, b.Client, dlqKey, dlq.ListParams{})
		if err != nil || len(got) != 1 {
			t.Fatalf("List: %v %v", got, err)
		}
		e.ID = id
		if got[0] != e {
			t.Errorf("entry %+v, want %+v", got[0], e)
		}
		raw, _ := b.Client.XRange(ctx, dlqKey, "-", "+").Result()
		if v := raw[0].Values["dead_at"]; v != "2030-01-02T03:04:05Z" {
			t.Errorf("dead_at %v, want RFC 3339", v)
		}

		// No DLQ configured: acknowledge only.
		src2 := pendingEntry(t, b.Client, key, "task_id", uuid.NewString())
		none, _ := dlq.NewWriter(dlq.Config{Stream: key, Group: group}, b.Client)
		if id, err := none.Write(ctx, dlq.Entry{SourceID: src2}); err != nil || id != "" {
			t.Errorf("Write without DLQ: %q %v", id, err)
		}
		if pending(t, b.Client, key) != 0 {
			t.Error("not acknowledged without a DLQ")
		}
		if n, _ := b.Client.XLen(ctx, dlqKey).Result(); n != 1 {
			t.Errorf("DLQ length %d, want 1", n)
		}
	})
}

// TestWriterDeathOnce: entries that carry the same death (Entry.Death) are
// dead-lettered once; all of them are acknowledged. A failed XADD leaves
// no marker behind, and another death of the task is written again.
func TestWriterDeathOnce(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, dlqKey := testenv.Keys(t)
		w, err := dlq.NewWriter(dlq.Config{Stream: key, Group: group, DLQ: dlqKey}, b.Client)
		if err != nil {
			t.Fatal(err)
		}
		taskID := uuid.NewString()
		entry := func(src, death string) dlq.Entry {
			return dlq.Entry{TaskID: taskID, Kind: "k", AttemptCount: 3, LastError: "boom", SourceID: src, Death: death}
		}
		first := pendingEntry(t, b.Client, key, "task_id", taskID)
		// A failed XADD (DLQ key of the wrong type) sets no marker.
		b.Client.Set(ctx, dlqKey, "x", 0)
		if _, err := w.Write(ctx, entry(first, taskID+":1")); err == nil {
			t.Fatal("Write to a string key succeeded")
		}
		b.Client.Del(ctx, dlqKey)
		if id, err := w.Write(ctx, entry(first, taskID+":1")); err != nil || id == "" {
			t.Fatalf("Write after the key was fixed: %q %v, want an entry", id, err)
		}
		dup := pendingEntry(t, b.Client, key, "task_id", taskID)
		if id, err := w.Write(ctx, entry(dup, taskID+":1")); err != nil || id != "" {
			t.Fatalf("Write of the same death from another entry: %q %v, want nothing written", id, err)
		}
		if pending(t, b.Client, key) != 0 {
			t.Error("the duplicate entry was not acknowledged")
		}
		again := pendingEntry(t, b.Client, key, "task_id", taskID)
		if id, err := w.Write(ctx, entry(again, taskID+":2")); err != nil || id == "" {
			t.Fatalf("Write of a later death: %q %v, want an entry", id, err)
		}
		if n, _ := b.Client.XLen(ctx, dlqKey).Result(); n != 2 {
			t.Errorf("DLQ length %d, want 2 (one per death)", n)
		}
	})
}

func TestList(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, dlqKey := testenv.Keys(t)
		w, _ := dlq.NewWriter(dlq.Config{Stream: key, Group: group, DLQ: dlqKey}, b.Client)
		var ids []string
		for i := range 5 {
			src := pendingEntry(t, b.Client, key, "task_id", uuid.NewString())
			id, err := w.Write(ctx, dlq.Entry{TaskID: "t", AttemptCount: i, SourceID: src})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		page := func(p dlq.ListParams) string {
			es, err := dlq.List(ctx, b.Client, dlqKey, p)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, e := range es {
				out = append(out, e.ID)
			}
			return strings.Join(out, ",")
		}
		if got, want := page(dlq.ListParams{Count: 2}), strings.Join(ids[:2], ","); got != want {
			t.Errorf("first page %s, want %s", got, want)
		}
		if got, want := page(dlq.ListParams{Count: 2, After: ids[1]}), strings.Join(ids[2:4], ","); got != want {
			t.Errorf("second page %s, want %s", got, want)
		}
		if got, want := page(dlq.ListParams{Count: 2, Newest: true}), ids[4]+","+ids[3]; got != want {
			t.Errorf("newest %s, want %s", got, want)
		}
		if got, want := page(dlq.ListParams{Count: 10, Newest: true, After: ids[1]}), ids[0]; got != want {
			t.Errorf("newest after %s: %s, want %s", ids[1], got, want)
		}
		if got := page(dlq.ListParams{}); len(strings.Split(got, ",")) != 5 {
			t.Errorf("default page %s", got)
		}
		if _, err := dlq.List(ctx, b.Client, dlqKey, dlq.ListParams{Count: -1}); err == nil || !strings.Contains(err.Error(), "Count") {
			t.Errorf("Count -1: %v", err)
		}
		if es, err := dlq.List(ctx, b.Client, dlqKey+":missing", dlq.ListParams{}); err != nil || len(es) != 0 {
			t.Errorf("missing key: %v %v", es, err)
		}
	})
}

func TestReplay(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		ctx := context.Background()
		key, dlqKey := testenv.Keys(t)
		db := testenv.DB(t)
		store, err := task.NewStore(task.Config{Stream: key}, db)
		if err != nil {
			t.Fatal(err)
		}
		created, err := store.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		id := created.Task.ID
		if _, err := store.Start(ctx, "w", time.Minute, id); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Fail(ctx, "w", task.Failure{ID: id, Error: "bad", Permanent: true}); err != nil {
			t.Fatal(err)
		}
		w, _ := dlq.NewWriter(dlq.Config{Stream: key, Group: group, DLQ: dlqKey}, b.Client)
		write := func(taskID string) string {
			src := pendingEntry(t, b.Client, key, "task_id", taskID)
			eid, err := w.Write(ctx, dlq.Entry{TaskID: taskID, Kind: "k", SourceID: src, LastError: "bad"})
			if err != nil {
				t.Fatal(err)
			}
			return eid
		}
		dead := write(id.String())
		poison := write("garbage")
		unknown := write(uuid.NewString())

		res, err := dlq.Replay(ctx, b.Client, dlqKey, store, "operator", dead, poison, unknown, "0-1")
		if err != nil {
			t.Fatal(err)
		}
		want := []dlq.ReplayOutcome{dlq.Replayed, dlq.Poison, dlq.TaskNotFound, dlq.EntryNotFound}
		for i, r := range res {
			if r.Outcome != want[i] {
				t.Errorf("entry %s: %s (%s), want %s", r.EntryID, r.Outcome, r.Detail, want[i])
			}
		}
		if !strings.Contains(res[1].Detail, "cannot be replayed") {
			t.Errorf("poison detail %q", res[1].Detail)
		}
		tk, err := store.Get(ctx, id)
		if err != nil || tk.Status != task.Queued || tk.AttemptCount != 0 {
			t.Fatalf("task after replay: %+v %v", tk, err)
		}
		var events int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE task_id = $1`, id).Scan(&events); err != nil || events != 2 {
			t.Errorf("outbox events %d (%v), want 2 (create + redrive)", events, err)
		}
		left, _ := dlq.List(ctx, b.Client, dlqKey, dlq.ListParams{})
		if len(left) != 2 || left[0].ID != poison || left[1].ID != unknown {
			t.Errorf("left in the DLQ: %+v, want the poison and unknown entries", left)
		}
		// A stale entry of a task that is no longer DEAD is removed.
		stale := write(id.String())
		res, err = dlq.Replay(ctx, b.Client, dlqKey, store, "operator", stale)
		if err != nil || res[0].Outcome != dlq.NotDead || res[0].Status != task.Queued {
			t.Fatalf("stale replay: %+v %v", res, err)
		}
		if _, ok, _ := dlq.Get(ctx, b.Client, dlqKey, stale); ok {
			t.Error("stale entry not removed")
		}
	})
}

// TestWriterRefusesKeysInDifferentClusterSlots: on Redis Cluster the DLQ
// script's keys must share a hash tag; a single-node client takes any keys.
func TestWriterRefusesKeysInDifferentClusterSlots(t *testing.T) {
	t.Parallel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}) // never dialled
	defer cc.Close()
	for _, tc := range []struct {
		stream, dlq string
		ok          bool
	}{
		{"{ingest}:tasks", "{ingest}:tasks:dlq", true},
		{"a{q}", "b{q}c", true},
		{"ingest:tasks", "", true},
		{"ingest:tasks", "ingest:tasks:dlq", false},
		{"{a}:tasks", "{b}:tasks:dlq", false},
		{"{ingest}:tasks", "ingest:tasks:dlq", false},
		{"{}:tasks", "{}:tasks:dlq", false},
	} {
		_, err := dlq.NewWriter(dlq.Config{Stream: tc.stream, Group: "g", DLQ: tc.dlq}, cc)
		if tc.ok != (err == nil) {
			t.Errorf("cluster, stream %q, DLQ %q: NewWriter = %v, want ok %v", tc.stream, tc.dlq, err, tc.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), tc.dlq) || !strings.Contains(err.Error(), "hash tag")) {
			t.Errorf("error %q does not name the DLQ key %q and the hash tag", err, tc.dlq)
		}
	}
	single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer single.Close()
	if _, err := dlq.NewWriter(dlq.Config{Stream: "ingest:tasks", Group: "g", DLQ: "ingest:tasks:dlq"}, single); err != nil {
		t.Errorf("single node, keys without a tag: NewWriter = %v", err)
	}
}
