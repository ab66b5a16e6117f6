package sqlenqueue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestSQLCreateMatchesGo: random batches, the same through
// ingest_enqueue_batch and through the Go store's CreateBatch (each on a
// kind of its own with the same settings: group window and weights, and
// at random paused, a per-group concurrency, sequences that continue past
// a DEAD task), leave their
// tasks in the same state: status, parked, waiting for edges, due later,
// priority, place in a sequence, which earlier item an idempotency key or
// the payload dedup resolved an item to, and the task's outbox rows (due
// now, held back for an edge, due later). The tasks mix groups, delays,
// dependencies on a QUEUED, a SUCCEEDED and a DEAD task (either policy),
// a sequence key, an idempotency key, the payload dedup and a priority,
// so that each feature's decision meets the others'; every fourth
// scenario makes one call per item (Create, ingest_enqueue). 60 scenarios;
// INGEST_SQL_DIFF_N sets another number (1,500 ran clean).
func TestSQLCreateMatchesGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := storeOn(t, "s:diff")
	parent := func(end string) uuid.UUID {
		c, err := store.Create(ctx, task.NewTask{Kind: "parent", Payload: json.RawMessage(fmt.Sprintf("%q", end))})
		if err != nil {
			t.Fatal(err)
		}
		id := c.Task.ID
		if end == "QUEUED" {
			return id
		}
		if rs, err := store.Start(ctx, "w", time.Minute, id); err != nil || rs[0].Outcome != task.Started {
			t.Fatal(rs, err)
		}
		if end == "SUCCEEDED" {
			_, err = store.Succeed(ctx, "w", id)
		} else {
			_, err = store.Fail(ctx, "w", task.Failure{ID: id, Error: "x", Permanent: true})
		}
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	parents := []uuid.UUID{parent("QUEUED"), parent("SUCCEEDED"), parent("DEAD")}

	scenarios := 60
	if v := os.Getenv("INGEST_SQL_DIFF_N"); v != "" {
		var err error
		if scenarios, err = strconv.Atoi(v); err != nil || scenarios < 1 {
			t.Fatalf("INGEST_SQL_DIFF_N=%q: want a whole number of at least 1", v)
		}
	}
	for seed := range scenarios {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		window := 1 + r.IntN(3)
		weights := map[string]int{}
		if r.IntN(2) == 0 {
			weights["b"] = 2
		}
		settings := task.KindUpdate{GroupWindow: &window, GroupWeights: weights}
		if r.IntN(5) == 0 {
			paused := true
			settings.Paused = &paused
		}
		if r.IntN(4) == 0 {
			one := 1
			settings.ConcurrencyPerGroup = &one
		}
		if r.IntN(4) == 0 {
			cont := "continue"
			settings.SequenceOnFailure = &cont
		}
		var batches [][]task.NewTask
		for b := range 1 + r.IntN(3) {
			var batch []task.NewTask
			for i := range 1 + r.IntN(5) {
				nt := task.NewTask{Payload: json.RawMessage(fmt.Sprint(seed*1000 + b*100 + i))}
				nt.GroupKey = []string{"", "a", "a", "b"}[r.IntN(4)]
				if r.IntN(6) == 0 {
					nt.Delay = time.Hour
				}
				switch d := r.IntN(6); d {
				case 0, 1, 2:
					nt.DependsOn = []uuid.UUID{parents[d]}
					if r.IntN(2) == 0 {
						nt.OnDependencyFailure = task.OnFailureRun
					}
				}
				if r.IntN(3) == 0 {
					nt.SequenceKey = "s"
				}
				if r.IntN(6) == 0 {
					// Repeated in the batch only: an item whose key an
					// earlier create holds takes room from its group's
					// window in both paths, and the SQL one gives it back
					// when it has other reasons to count the window again.
					nt.IdempotencyKey = fmt.Sprint("k", b)
				}
				if r.IntN(6) == 0 {
					nt.DedupByPayload, nt.Payload = true, json.RawMessage(`"same"`)
				}
				if r.IntN(4) == 0 {
					nt.Priority = 1
				}
				batch = append(batch, nt)
			}
			batches = append(batches, batch)
		}

		// Every fourth scenario creates each item by a call of its own
		// (Create, ingest_enqueue).
		each := seed%4 == 3
		got := map[string][]string{}
		for _, path := range []string{"go", "sql"} {
			kind := fmt.Sprintf("%s-diff-%d", path, seed)
			if _, err := store.SetKind(ctx, "test", kind, settings); err != nil {
				t.Fatal(err)
			}
			first := map[uuid.UUID]int{} // a task's first item, across the batches
			n := 0
			for _, batch := range batches {
				var ids []uuid.UUID
				if each {
					for _, nt := range batch {
						ids = append(ids, createVia(t, db, store, path+"-each", kind, []task.NewTask{nt})...)
					}
				} else {
					ids = createVia(t, db, store, path, kind, batch)
				}
				for _, id := range ids {
					same := ""
					if j, ok := first[id]; ok {
						same = fmt.Sprintf(" (item %d's task)", j)
					} else {
						first[id] = n
					}
					got[path] = append(got[path], fmt.Sprintf("item %d: %s%s", n, state(t, db, id), same))
					n++
				}
			}
		}
		if g, s := strings.Join(got["go"], "\n"), strings.Join(got["sql"], "\n"); g != s {
			t.Errorf("scenario %d (window %d, weights %v, paused %v, concurrency per group %v, sequence on failure %v, one call per item %v), batches:\n%s\nthrough the Go store:\n%s\nthrough SQL:\n%s",
				seed, window, weights, settings.Paused != nil, settings.ConcurrencyPerGroup != nil, settings.SequenceOnFailure != nil, each,
				describeBatches(batches, parents), g, s)
		}
	}
}

// createVia creates batch as tasks of kind through the Go store
// (CreateBatch; path "go-each": Create, batch being one task) or through
// SQL (ingest_enqueue_batch; "sql-each": ingest_enqueue), and returns
// each item's task; it fails t on an error.
func createVia(t *testing.T, db *pgxpool.Pool, store *task.Store, path, kind string, batch []task.NewTask) []uuid.UUID {
	t.Helper()
	ids, err := create(db, store, path, kind, batch)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// create is createVia returning its error, for a goroutine of a test.
func create(db *pgxpool.Pool, store *task.Store, path, kind string, batch []task.NewTask) ([]uuid.UUID, error) {
	ctx := context.Background()
	var ids []uuid.UUID
	if path == "go-each" {
		nt := batch[0]
		nt.Kind = kind
		res, err := store.Create(ctx, nt)
		if err != nil {
			return nil, err
		}
		return []uuid.UUID{res.Task.ID}, nil
	}
	if path == "go" {
		nts := make([]task.NewTask, len(batch))
		for i, nt := range batch {
			nt.Kind = kind
			nts[i] = nt
		}
		res, err := store.CreateBatch(ctx, nts)
		if err != nil {
			return nil, err
		}
		for _, r := range res {
			ids = append(ids, r.Task.ID)
		}
		return ids, nil
	}
	var js []json.RawMessage
	for _, nt := range batch {
		el := map[string]any{"kind": kind, "payload": nt.Payload}
		if nt.GroupKey != "" {
			el["group_key"] = nt.GroupKey
		}
		if nt.Delay > 0 {
			el["delay_ms"] = nt.Delay.Milliseconds()
		}
		if len(nt.DependsOn) > 0 {
			el["depends_on"] = nt.DependsOn
		}
		if nt.OnDependencyFailure != "" {
			el["on_dependency_failure"] = nt.OnDependencyFailure
		}
		if nt.SequenceKey != "" {
			el["sequence_key"] = nt.SequenceKey
		}
		if nt.IdempotencyKey != "" {
			el["idempotency_key"] = nt.IdempotencyKey
		}
		if nt.DedupByPayload {
			el["dedup_by_payload"] = true
		}
		if nt.Priority != 0 {
			el["priority"] = nt.Priority
		}
		if path == "sql-each" {
			payload := el["payload"]
			delete(el, "kind")
			delete(el, "payload")
			opts, err := json.Marshal(el)
			if err != nil {
				return nil, err
			}
			var id uuid.UUID
			if err := db.QueryRow(ctx, `SELECT ingest_enqueue($1, $2::jsonb, $3::jsonb)`, kind, payload, string(opts)).Scan(&id); err != nil {
				return nil, fmt.Errorf("ingest_enqueue(%q, %s, %s): %w", kind, payload, opts, err)
			}
			return []uuid.UUID{id}, nil
		}
		b, err := json.Marshal(el)
		if err != nil {
			return nil, err
		}
		js = append(js, b)
	}
	all, err := json.Marshal(js)
	if err != nil {
		return nil, err
	}
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue_batch($1::jsonb)`, string(all)).Scan(&ids); err != nil {
		return nil, fmt.Errorf("ingest_enqueue_batch(%s): %w", all, err)
	}
	return ids, nil
}

// state says what a create left of task id, apart from its identity and
// times: status, parked, edges waited for (while unfinished: a task
// cancelled at its create by a dependency may count its other edges or
// not), due later, priority, place in
// its sequence (its rank: the numbers may skip), and its outbox rows by
// when they are due.
func state(t *testing.T, db *pgxpool.Pool, id uuid.UUID) string {
	t.Helper()
	var s string
	if err := db.QueryRow(context.Background(), `
SELECT format('%s group %s%s%s%s prio %s seq %s; rows: %s due, %s held, %s later',
    t.status, coalesce(t.group_key, '-'),
    CASE WHEN t.parked_at IS NOT NULL THEN ' parked' ELSE '' END,
    CASE WHEN coalesce(t.waiting_for, 0) > 0 AND t.finished_at IS NULL THEN ' waiting ' || t.waiting_for ELSE '' END,
    CASE WHEN t.next_retry_at > now() THEN ' due later' ELSE '' END,
    coalesce(t.priority, 2),
    coalesce((SELECT count(*) FROM ingest_task s WHERE s.kind = t.kind AND s.sequence_key = t.sequence_key
              AND s.sequence_no <= t.sequence_no)::text, '-'),
    (SELECT count(*) FROM outbox_event o WHERE o.task_id = t.id AND o.next_retry_at <= now()),
    (SELECT count(*) FROM outbox_event o WHERE o.task_id = t.id AND o.next_retry_at = $2),
    (SELECT count(*) FROM outbox_event o WHERE o.task_id = t.id AND o.next_retry_at > now() AND o.next_retry_at <> $2))
FROM ingest_task t WHERE t.id = $1`, id, task.HeldUntil).Scan(&s); err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	return s
}

// describeBatches prints batches for a failure's message, naming the
// parents by their state.
func describeBatches(batches [][]task.NewTask, parents []uuid.UUID) string {
	names := map[uuid.UUID]string{parents[0]: "QUEUED", parents[1]: "SUCCEEDED", parents[2]: "DEAD"}
	var b strings.Builder
	for i, batch := range batches {
		fmt.Fprintf(&b, "  batch %d:", i)
		for _, nt := range batch {
			var parts []string
			if nt.GroupKey != "" {
				parts = append(parts, "group "+nt.GroupKey)
			}
			if nt.Delay > 0 {
				parts = append(parts, "delayed")
			}
			for _, d := range nt.DependsOn {
				parts = append(parts, "after "+names[d]+" "+nt.OnDependencyFailure)
			}
			if nt.SequenceKey != "" {
				parts = append(parts, "seq")
			}
			if nt.IdempotencyKey != "" {
				parts = append(parts, "key")
			}
			if nt.DedupByPayload {
				parts = append(parts, "dedup")
			}
			if nt.Priority != 0 {
				parts = append(parts, fmt.Sprint("prio ", nt.Priority))
			}
			fmt.Fprintf(&b, " {%s}", strings.Join(parts, ", "))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestResolvedItemGetsNoEdges: an item of ingest_enqueue_batch that an
// idempotency key or the payload dedup resolves to an earlier item's
// task gives that task neither its dependencies nor a place in its
// sequence (as through the Go store); its fields are still checked.
func TestResolvedItemGetsNoEdges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	store := newStore(t, db, task.Config{})
	dep, err := store.Create(ctx, task.NewTask{Kind: "parent", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue_batch($1::jsonb)`, fmt.Sprintf(`[
		{"kind":"r","payload":1,"idempotency_key":"a"},
		{"kind":"r","payload":2,"idempotency_key":"a","sequence_key":"s","depends_on":[%q]},
		{"kind":"r","payload":"same","dedup_by_payload":true},
		{"kind":"r","payload":"same","dedup_by_payload":true,"sequence_key":"s","depends_on":[%q]}]`, dep.Task.ID, dep.Task.ID)).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if ids[1] != ids[0] || ids[3] != ids[2] {
		t.Fatalf("items resolved to %v; want items 1 and 3 resolved to items 0 and 2", ids)
	}
	for _, id := range []uuid.UUID{ids[0], ids[2]} {
		got, err := store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.WaitingFor != 0 || got.SequenceKey != "" || got.DependencyDepth != 0 {
			t.Errorf("task %s: waiting for %d, sequence key %q, dependency depth %d; want no edge and no sequence (only a resolved item asked for them)",
				id, got.WaitingFor, got.SequenceKey, got.DependencyDepth)
		}
	}
	_, err = db.Exec(ctx, `SELECT ingest_enqueue_batch('[{"kind":"r","payload":1,"idempotency_key":"a"},{"kind":"r","payload":1,"idempotency_key":"a","sequence_key":7}]')`)
	if pg := pgError(t, err); pg.ColumnName != "sequence_key" {
		t.Errorf("a resolved item's bad sequence_key: %v; want it refused naming the field", err)
	}
}

// TestRepeatedKeyTakesNoRoom: an item that repeats the idempotency key of
// an earlier item of its batch creates no task, and takes no room in its
// group's window, through the Go store as through SQL: on a window of 2,
// the batch's third item, after two items of one key, is in flight.
func TestRepeatedKeyTakesNoRoom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := storeOn(t, "s:repeat")
	window := 2
	batch := []task.NewTask{
		{GroupKey: "g", IdempotencyKey: "k", Payload: json.RawMessage(`1`)},
		{GroupKey: "g", IdempotencyKey: "k", Payload: json.RawMessage(`2`)},
		{GroupKey: "g", Payload: json.RawMessage(`3`)},
	}
	want := "g in flight 1 row, g in flight 1 row, g in flight 1 row"
	for _, path := range []string{"go", "sql"} {
		kind := path + "-repeat"
		if _, err := store.SetKind(ctx, "test", kind, task.KindUpdate{GroupWindow: &window}); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, id := range createVia(t, db, store, path, kind, batch) {
			got = append(got, describe(t, db, id))
		}
		if g := strings.Join(got, ", "); g != want {
			t.Errorf("%s path: %s; want %s", path, g, want)
		}
	}
}

// TestConcurrentSQLAndGoCreates: concurrent SQL and Go creates of one
// kind's groups, with dependencies on one task, sequences and repeated
// keys, never deadlock each other (both take the payload dedup's, the
// groups', the dependencies' and the sequences' locks in that order:
// before, a Go create took a sequence's lock before its groups' and a SQL
// create after, and 3 runs of 3 failed with "deadlock detected"), and
// never leave a group more tasks in the stream than its window (the SQL
// create counts a window again after its body, and unparks): 6 producers,
// 3 through ingest_enqueue_batch and 3 through CreateBatch, each 15
// batches of 8.
func TestConcurrentSQLAndGoCreates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, store := storeOn(t, "s:busy")
	window := 3
	if _, err := store.SetKind(ctx, "test", "busy", task.KindUpdate{GroupWindow: &window, GroupWeights: map[string]int{"b": 2}}); err != nil {
		t.Fatal(err)
	}
	parent, err := store.Create(ctx, task.NewTask{Kind: "parent", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for p := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(p), 2))
			path := []string{"go", "sql"}[p%2]
			for b := range 15 {
				var batch []task.NewTask
				for i := range 8 {
					nt := task.NewTask{Payload: json.RawMessage(fmt.Sprint(p*10000 + b*100 + i)), GroupKey: []string{"a", "b", "c"}[r.IntN(3)]}
					switch r.IntN(6) {
					case 0:
						nt.DependsOn = []uuid.UUID{parent.Task.ID}
					case 1:
						nt.SequenceKey = fmt.Sprint("s", r.IntN(2))
					case 2:
						nt.IdempotencyKey = fmt.Sprintf("p%d-b%d", p, b)
					}
					batch = append(batch, nt)
				}
				if _, err := create(db, store, path, "busy", batch); err != nil {
					t.Errorf("producer %d (%s), batch %d: %v", p, path, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	rows, err := db.Query(ctx, `SELECT g, ingest_group_admitted('busy', g), ingest_group_window('busy', g),
		(SELECT count(*) FROM ingest_task p WHERE p.kind = 'busy' AND p.group_key = g AND p.parked_at IS NOT NULL)
		FROM unnest(ARRAY['a', 'b', 'c']) AS g ORDER BY g`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var g string
		var admitted, win, parked int
		if err := rows.Scan(&g, &admitted, &win, &parked); err != nil {
			t.Fatal(err)
		}
		if admitted > win {
			t.Errorf("group %s: %d tasks in the stream, its window is %d", g, admitted, win)
		}
		if parked == 0 {
			t.Errorf("group %s: no task parked; the test means its window to fill", g)
		}
		t.Logf("group %s: %d in the stream (window %d), %d parked", g, admitted, win, parked)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
