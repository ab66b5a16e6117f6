package task_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

func TestList(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	// 21 tasks, oldest first: kinds alternate a, b, c; every third is started.
	var created []task.Task
	for i := 0; i < 21; i++ {
		tk := b.create(t, task.NewTask{Kind: string(rune('a' + i%3)), Payload: json.RawMessage(fmt.Sprint(i))})
		if i%3 == 0 {
			b.start(t, "w", time.Minute, tk.ID, task.Started)
		}
		created = append(created, tk)
	}
	newestFirst := func(keep func(i int) bool) []uuid.UUID {
		var ids []uuid.UUID
		for i := len(created) - 1; i >= 0; i-- {
			if keep(i) {
				ids = append(ids, created[i].ID)
			}
		}
		return ids
	}

	tests := []struct {
		name  string
		p     task.ListParams
		want  []uuid.UUID
		pages int
	}{
		{"All", task.ListParams{}, newestFirst(func(int) bool { return true }), 1},
		{"AllPaged", task.ListParams{Limit: 4}, newestFirst(func(int) bool { return true }), 6},
		{"LastPageFull", task.ListParams{Limit: 7}, newestFirst(func(int) bool { return true }), 3},
		{"OnePerPage", task.ListParams{Limit: 1, Kind: "b"}, newestFirst(func(i int) bool { return i%3 == 1 }), 7},
		{"ByStatus", task.ListParams{Status: task.Running}, newestFirst(func(i int) bool { return i%3 == 0 }), 1},
		{"ByStatusPaged", task.ListParams{Status: task.Queued, Limit: 5}, newestFirst(func(i int) bool { return i%3 != 0 }), 3},
		{"ByKind", task.ListParams{Kind: "c"}, newestFirst(func(i int) bool { return i%3 == 2 }), 1},
		{"ByStatusAndKind", task.ListParams{Status: task.Running, Kind: "a", Limit: 2}, newestFirst(func(i int) bool { return i%3 == 0 }), 4},
		{"NoMatch", task.ListParams{Status: task.Running, Kind: "b"}, nil, 1},
		{"UnknownKind", task.ListParams{Kind: "zzz"}, nil, 1},
		{"CreatedWindowPaged", task.ListParams{Since: created[5].CreatedAt, Until: created[15].CreatedAt, Limit: 4},
			newestFirst(func(i int) bool { return i >= 5 && i < 15 }), 3},
		{"CreatedWindowByKind", task.ListParams{Kind: "a", Since: created[6].CreatedAt},
			newestFirst(func(i int) bool { return i >= 6 && i%3 == 0 }), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []uuid.UUID
			p := tt.p
			pages := 0
			for {
				tasks, next, err := b.store.List(b.ctx, p)
				if err != nil {
					t.Fatalf("List(%+v): %v", p, err)
				}
				pages++
				limit := p.Limit
				if limit == 0 {
					limit = 50
				}
				if len(tasks) > limit {
					t.Fatalf("page %d has %d tasks, over the limit %d", pages, len(tasks), limit)
				}
				for _, tk := range tasks {
					if tk.Payload != nil {
						t.Fatalf("List returned a payload for %s", tk.ID)
					}
					if (p.Status != "" && tk.Status != p.Status) || (p.Kind != "" && tk.Kind != p.Kind) {
						t.Fatalf("List(%+v) returned %s task of kind %s", p, tk.Status, tk.Kind)
					}
					got = append(got, tk.ID)
				}
				if next == "" {
					break
				}
				if len(tasks) != limit {
					t.Fatalf("page %d has %d tasks and a next cursor, want a full page of %d", pages, len(tasks), limit)
				}
				if pages > 50 {
					t.Fatal("pagination does not end")
				}
				p.Cursor = next
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("List(%+v) returned\n%v\nwant (newest first)\n%v", tt.p, got, tt.want)
			}
			if pages != tt.pages {
				t.Fatalf("%d pages, want %d", pages, tt.pages)
			}
		})
	}
}

// TestListStableWhileAdding pages through tasks while new ones are created:
// every task that existed at the start is seen exactly once, and newer ones
// never appear on later pages.
func TestListStableWhileAdding(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	before := map[uuid.UUID]bool{}
	// One batch: the tasks share created_at, so the id breaks the tie.
	var batch []task.NewTask
	for i := 0; i < 10; i++ {
		batch = append(batch, task.NewTask{Kind: "k", Payload: json.RawMessage(fmt.Sprint(i))})
	}
	res, err := b.store.CreateBatch(b.ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		before[r.Task.ID] = true
	}
	for i := 0; i < 5; i++ {
		before[b.create(t, task.NewTask{}).ID] = true
	}
	seen := map[uuid.UUID]int{}
	p := task.ListParams{Limit: 3}
	for pages := 0; ; pages++ {
		tasks, next, err := b.store.List(b.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range tasks {
			seen[tk.ID]++
			if !before[tk.ID] {
				t.Fatalf("page %d shows %s, created after the listing began", pages, tk.ID)
			}
		}
		b.create(t, task.NewTask{}) // a newer task between pages
		if next == "" {
			break
		}
		p.Cursor = next
	}
	for id := range before {
		if seen[id] != 1 {
			t.Fatalf("task %s seen %d times, want once", id, seen[id])
		}
	}
}

func TestListInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		name    string
		p       task.ListParams
		wantMsg string
	}{
		{"UnknownStatus", task.ListParams{Status: "BOGUS"}, "status"},
		{"LowercaseStatus", task.ListParams{Status: "queued"}, "status"},
		{"NegativeLimit", task.ListParams{Limit: -1}, "limit"},
		{"LimitTooLarge", task.ListParams{Limit: task.MaxListLimit + 1}, "limit"},
		{"CursorNotBase64", task.ListParams{Cursor: "!!!"}, "cursor"},
		{"CursorWithoutSeparator", task.ListParams{Cursor: enc("2024-01-01T00:00:00Z")}, "cursor"},
		{"CursorBadTime", task.ListParams{Cursor: enc("yesterday|" + uuid.NewString())}, "cursor"},
		{"CursorBadID", task.ListParams{Cursor: enc("2024-01-01T00:00:00Z|not-a-uuid")}, "cursor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := b.store.List(b.ctx, tt.p)
			if !errors.Is(err, task.ErrInvalidTask) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("List(%+v) = %v, want ErrInvalidTask naming %s", tt.p, err, tt.wantMsg)
			}
		})
	}
	t.Run("MaxLimitAllowed", func(t *testing.T) {
		t.Parallel()
		if _, _, err := b.store.List(b.ctx, task.ListParams{Limit: task.MaxListLimit}); err != nil {
			t.Fatalf("List with the max limit: %v", err)
		}
	})
}

func TestGetWithTransitions(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	id := b.create(t, task.NewTask{Kind: "show", Payload: json.RawMessage(`{"k":"v"}`), IdempotencyKey: "idem"}).ID
	b.start(t, "w1", time.Minute, id, task.Started)
	tk, recs, err := b.store.GetWithTransitions(b.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if tk.ID != id || tk.Kind != "show" || string(tk.Payload) != `{"k": "v"}` || tk.IdempotencyKey != "idem" || tk.Status != task.Running {
		t.Fatalf("task = %+v", tk)
	}
	if len(recs) != 2 || recs[0].To != "QUEUED" || recs[1].To != "RUNNING" || recs[1].Worker != "w1" || recs[0].ID >= recs[1].ID {
		t.Fatalf("transitions = %+v, want created then started by w1, oldest first", recs)
	}
	if _, _, err := b.store.GetWithTransitions(b.ctx, uuid.New()); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("GetWithTransitions of an unknown id = %v, want ErrNotFound", err)
	}
}

// TestListScheduled: ListParams.Scheduled lists the waiting tasks due
// later (a delayed one, a retry in its backoff), not a task due now nor a
// finished one; SetStatus reads "scheduled" and the states in any case and
// names the status field for anything else.
func TestListScheduled(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	delayed := b.create(t, task.NewTask{Delay: time.Hour}).ID
	retry := b.create(t, task.NewTask{}).ID
	b.start(t, "w1", time.Minute, retry, task.Started)
	b.fail(t, "w1", task.Failure{ID: retry, Error: "boom", RetryAfter: time.Hour})
	b.create(t, task.NewTask{}) // due now
	var p task.ListParams
	if ferr := p.SetStatus("Scheduled"); ferr != nil || !p.Scheduled || p.Status != "" {
		t.Fatalf("SetStatus(Scheduled) = %v, params %+v", ferr, p)
	}
	got, _, err := b.store.List(b.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != retry || got[1].ID != delayed {
		t.Fatalf("scheduled listing %+v, want the retry and the delayed task, newest first", got)
	}
	if ferr := p.SetStatus("retrying"); ferr != nil || p.Scheduled || p.Status != task.Retrying {
		t.Fatalf("SetStatus(retrying) = %v, params %+v", ferr, p)
	}
	if ferr := p.SetStatus("soon"); ferr == nil || ferr.Field != "status" {
		t.Fatalf("SetStatus(soon) = %v, want a status field error", ferr)
	}
}
