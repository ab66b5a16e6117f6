package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// TestTaskListWorkflow: task list --workflow lists the tasks of one
// pipeline, and its "more" hint keeps the filter.
func TestTaskListWorkflow(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t)
	store, err := task.NewStore(task.Config{}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.CreateBatch(context.Background(), []task.NewTask{
		{Kind: "fetch", Ref: "f", Payload: json.RawMessage(`1`)},
		{Kind: "embed", Ref: "e1", DependsOnRefs: []string{"f"}, Payload: json.RawMessage(`2`)},
		{Kind: "embed", Ref: "e2", DependsOnRefs: []string{"f"}, Payload: json.RawMessage(`3`)},
		{Kind: "notify", DependsOnRefs: []string{"e1", "e2"}, Payload: json.RawMessage(`4`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Create(context.Background(), task.NewTask{Kind: "embed", Payload: json.RawMessage(`5`)}); err != nil {
		t.Fatal(err)
	}
	root := res[0].Task.ID.String()
	env := map[string]string{"INGEST_DATABASE_URL": db.URL}
	code, stdout, stderr := runCLI(t, env, "task", "list", "--workflow", root, "--json")
	var list struct {
		Tasks []struct {
			ID         uuid.UUID  `json:"id"`
			WorkflowID *uuid.UUID `json:"workflow_id"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(stdout), &list); code != 0 || err != nil || len(list.Tasks) != 4 {
		t.Fatalf("task list --workflow %s: exit %d, %d tasks (%v)\n%s%s", root, code, len(list.Tasks), err, stdout, stderr)
	}
	for _, x := range list.Tasks {
		if x.WorkflowID == nil || x.WorkflowID.String() != root {
			t.Fatalf("task %s of workflow %v listed", x.ID, x.WorkflowID)
		}
	}
	code, stdout, stderr = runCLI(t, env, "task", "list", "--workflow", root, "--kind", "embed", "--limit", "1")
	if code != 0 || !strings.Contains(stdout+stderr, "--workflow "+root) {
		t.Fatalf("task list --workflow --limit 1: exit %d; the hint of the next page lacks the workflow:\n%s%s", code, stdout, stderr)
	}
}
