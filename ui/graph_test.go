package ui_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/ui"
)

// pipeline is a small document pipeline: doc → chunk0..chunkN-1 → join,
// all of workflow doc.
type pipeline struct {
	doc, join task.Task
	chunks    []task.Task
}

// newPipeline creates a document pipeline of n chunks in one batch (the
// first chunk's kind is chunkKind; the join runs whatever its chunks'
// ends) and runs the document to success with a result: its chunks are
// released, the join waits for every chunk.
func (b *bundle) newPipeline(t *testing.T, n int, chunkKind string) pipeline {
	t.Helper()
	nts := []task.NewTask{{Kind: "doc.fetch", Ref: "doc", Payload: json.RawMessage(`{"url":"https://example.com/a.pdf"}`)}}
	var refs []string
	for i := range n {
		kind := "doc.embed"
		if i == 0 {
			kind = chunkKind
		}
		ref := fmt.Sprintf("chunk-%d", i)
		refs = append(refs, ref)
		nts = append(nts, task.NewTask{Kind: kind, Ref: ref, DependsOnRefs: []string{"doc"}, Payload: json.RawMessage(fmt.Sprintf(`{"chunk":%d}`, i))})
	}
	nts = append(nts, task.NewTask{Kind: "doc.index", DependsOnRefs: refs, OnDependencyFailure: task.OnFailureRun, Payload: json.RawMessage(`{}`)})
	res, err := b.store.CreateBatch(b.ctx, nts)
	if err != nil {
		t.Fatal(err)
	}
	var p pipeline
	p.doc, p.join = res[0].Task, res[len(res)-1].Task
	for _, r := range res[1 : len(res)-1] {
		p.chunks = append(p.chunks, r.Task)
	}
	if _, err := b.store.Start(b.ctx, "w1", time.Minute, p.doc.ID); err != nil {
		t.Fatal(err)
	}
	if rs, err := b.store.SucceedWith(b.ctx, "w1", task.Success{ID: p.doc.ID, Result: json.RawMessage(`{"pages":3}`)}); err != nil || !rs[0].Applied {
		t.Fatalf("SucceedWith: %v %+v", err, rs)
	}
	return p
}

var levelRE = regexp.MustCompile(`<h4>([^<]+)</h4>`)

// TestTaskPageGraph: a task's page shows its workflow (linked to the
// workflow's task list), its ancestors and descendants by level, each
// linked to its page, and the edges with their reason and release; a
// hostile kind shows as text; a task outside any pipeline shows no
// pipeline section.
func TestTaskPageGraph(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	c := b.client(t)
	const evil = "<script>alert(1)</script>"
	p := b.newPipeline(t, 3, "chunk"+evil)

	page := c.get("/ui/tasks/" + p.chunks[1].ID.String())
	want(t, page, 200, `id="pipeline"`, `href="/ui/tasks?workflow=`+p.doc.ID.String()+`"`,
		`href="/ui/tasks/`+p.doc.ID.String()+`"`, `href="/ui/tasks/`+p.join.ID.String()+`"`,
		"<h4>dependencies</h4>", "<h4>this task</h4>", "<h4>dependents</h4>", "holding", "3 tasks")
	if strings.Contains(page.body, "chunk"+evil) || strings.Contains(page.body, p.chunks[0].ID.String()) {
		t.Fatalf("a chunk's page shows its siblings (neither ancestors nor descendants):\n%s", clip(page.body))
	}

	// The join: the chunks one level up, the document two.
	page = c.get("/ui/tasks/" + p.join.ID.String())
	want(t, page, 200, "chunk&lt;script&gt;alert(1)&lt;/script&gt;", "5 tasks", `id="waiting-for">3 edges not yet released`,
		`<span class="badge ok">result</span>`, "run anyway (on_dependency_failure: run)")
	if strings.Contains(page.body, "<script>alert") {
		t.Fatalf("a hostile kind renders as markup:\n%s", clip(page.body))
	}
	var levels []string
	for _, m := range levelRE.FindAllStringSubmatch(page.body, -1) {
		levels = append(levels, m[1])
	}
	if got := strings.Join(levels, ","); got != "2 levels up,dependencies,this task" {
		t.Fatalf("the join's graph has the columns %q, want the document two levels up and the chunks one", got)
	}
	for _, ch := range p.chunks {
		if !strings.Contains(page.body, `href="/ui/tasks/`+ch.ID.String()+`"`) {
			t.Fatalf("the join's page does not link chunk %s", ch.ID)
		}
	}
	// The document: its edges are released, with their time.
	page = c.get("/ui/tasks/" + p.doc.ID.String())
	want(t, page, 200, "<h4>dependents</h4>", "<h4>2 levels down</h4>", "5 tasks")
	if n := strings.Count(page.body, "<td>dependency</td>"); n != 6 {
		t.Fatalf("the document's page lists %d edges, want 6", n)
	}
	// The live part carries the graph too.
	want(t, c.get("/ui/tasks/"+p.join.ID.String()+"?live=1"), 200, `id="graph"`)

	// A deleted dependency stays a node of its edge, marked.
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM ingest_task WHERE id = $1`, p.doc.ID); err != nil {
		t.Fatal(err)
	}
	want(t, c.get("/ui/tasks/"+p.join.ID.String()), 200, "deleted task")

	// A plain task: no pipeline section.
	plain := b.create(t, task.NewTask{Kind: "plain"})
	if page := c.get("/ui/tasks/" + plain.ID.String()); page.code != 200 || strings.Contains(page.body, `id="pipeline"`) {
		t.Fatalf("a task outside any pipeline shows a pipeline section (%d):\n%s", page.code, clip(page.body))
	}
}

// TestTaskPageGraphCut: a graph larger than ui.GraphMax shows GraphMax
// tasks, says so, and its page still answers.
func TestTaskPageGraphCut(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	c := b.client(t)
	root := b.create(t, task.NewTask{Kind: "root"})
	var leaves []task.NewTask
	for i := range ui.GraphMax + 50 {
		leaves = append(leaves, task.NewTask{Kind: "leaf", Payload: json.RawMessage(fmt.Sprint(i)), DependsOn: []uuid.UUID{root.ID}})
	}
	if _, err := b.store.CreateBatch(b.ctx, leaves); err != nil {
		t.Fatal(err)
	}
	page := c.get("/ui/tasks/" + root.ID.String())
	want(t, page, 200, `id="graph-cut"`, fmt.Sprintf("%d tasks", ui.GraphMax), fmt.Sprintf("cut at %d", ui.GraphMax))
	if n := strings.Count(page.body, `class="node`); n != ui.GraphMax {
		t.Fatalf("%d nodes shown, want %d", n, ui.GraphMax)
	}
}

// TestTaskListWorkflow: ?workflow= lists the tasks of one pipeline, keeps
// the filter in its links, and a malformed id is a 400 naming it.
func TestTaskListWorkflow(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	c := b.client(t)
	p := b.newPipeline(t, 2, "doc.embed")
	other := b.newPipeline(t, 1, "doc.embed")
	page := c.get("/ui/tasks?workflow=" + p.doc.ID.String())
	want(t, page, 200, `value="`+p.doc.ID.String()+`"`)
	for _, x := range append([]task.Task{p.doc, p.join}, p.chunks...) {
		if !strings.Contains(page.body, `href="/ui/tasks/`+x.ID.String()+`"`) {
			t.Fatalf("the workflow's list lacks task %s (%s):\n%s", x.ID, x.Kind, clip(page.body))
		}
	}
	if strings.Contains(page.body, other.doc.ID.String()) {
		t.Fatal("the workflow's list shows another workflow's task")
	}
	if !strings.Contains(page.body, "workflow="+p.doc.ID.String()) {
		t.Fatal("the list's links lose the workflow filter")
	}
	bad := c.get("/ui/tasks?workflow=" + url.QueryEscape("<b>nope"))
	want(t, bad, 400, "workflow: &#34;&lt;b&gt;nope&#34; is not a workflow id")
}
