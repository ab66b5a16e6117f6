package task_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
)

// TestListWorkflow: ListParams.Workflow lists the tasks of one pipeline
// (its root and every task under it), newest first, paged, with the other
// filters; another pipeline's tasks and tasks in none are left out.
func TestListWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t, task.Config{})
	dag := func(n int) []uuid.UUID {
		nts := []task.NewTask{{Kind: "doc", Ref: "doc", Payload: json.RawMessage(`{}`)}}
		var refs []string
		for i := range n {
			refs = append(refs, fmt.Sprint("c", i))
			nts = append(nts, task.NewTask{Kind: "chunk", Ref: refs[i], DependsOnRefs: []string{"doc"}, Payload: json.RawMessage(fmt.Sprint(i))})
		}
		nts = append(nts, task.NewTask{Kind: "join", DependsOnRefs: refs, Payload: json.RawMessage(`{}`)})
		res, err := b.store.CreateBatch(b.ctx, nts)
		if err != nil {
			t.Fatal(err)
		}
		var ids []uuid.UUID
		for _, r := range res {
			ids = append(ids, r.Task.ID)
		}
		return ids
	}
	mine := dag(4)
	other := dag(2)
	b.create(t, task.NewTask{Kind: "chunk"})
	var got []uuid.UUID
	p := task.ListParams{Workflow: mine[0], Limit: 4}
	for {
		page, next, err := b.store.List(b.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range page {
			if x.WorkflowID == nil || *x.WorkflowID != mine[0] {
				t.Fatalf("task %s of workflow %v listed under %s", x.ID, x.WorkflowID, mine[0])
			}
			got = append(got, x.ID)
		}
		if next == "" {
			break
		}
		p.Cursor = next
	}
	want := slices.Clone(mine)
	slices.SortFunc(want, func(a, b uuid.UUID) int { return -slices.Compare(a[:], b[:]) })
	if !slices.Equal(got, want) {
		t.Fatalf("workflow %s lists %v, want its %d tasks newest first %v", mine[0], got, len(mine), want)
	}
	chunks, _, err := b.store.List(b.ctx, task.ListParams{Workflow: other[0], Kind: "chunk"})
	if err != nil || len(chunks) != 2 {
		t.Fatalf("workflow %s, kind chunk: %d tasks (%v), want its 2 chunks", other[0], len(chunks), err)
	}
}
