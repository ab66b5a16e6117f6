package ui_test

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"

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

// link records that dependent waits for dependency (released or holding)
// and puts both in workflow wf, as creation with depends_on leaves them.
func (b *bundle) link(t *testing.T, wf, dependency, dependent uuid.UUID, released bool) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `
		WITH e AS (INSERT INTO ingest_task_dependency (task_id, depends_on, released_at)
		           VALUES ($2, $3, CASE WHEN $4 THEN now() END))
		UPDATE ingest_task SET workflow_id = $1,
		       waiting_for = CASE WHEN id = $2 AND NOT $4 THEN coalesce(waiting_for, 0) + 1 ELSE waiting_for END
		WHERE id IN ($2, $3)`, wf, dependent, dependency, released)
	if err != nil {
		t.Fatal(err)
	}
}

// newPipeline creates a document pipeline of n chunks; the first chunk's
// kind is chunkKind. The document has ended (its edges are released); the
// join waits for every chunk.
func (b *bundle) newPipeline(t *testing.T, n int, chunkKind string) pipeline {
	t.Helper()
	var p pipeline
	p.doc = b.create(t, task.NewTask{Kind: "doc.fetch"})
	p.join = b.create(t, task.NewTask{Kind: "doc.index"})
	for i := range n {
		kind := "doc.embed"
		if i == 0 {
			kind = chunkKind
		}
		c := b.create(t, task.NewTask{Kind: kind})
		p.chunks = append(p.chunks, c)
		b.link(t, p.doc.ID, p.doc.ID, c.ID, true)
		b.link(t, p.doc.ID, c.ID, p.join.ID, false)
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
	want(t, page, 200, "chunk&lt;script&gt;alert(1)&lt;/script&gt;", "5 tasks", `id="waiting-for">3 edges not yet released`)
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
	var ids []uuid.UUID
	for range ui.GraphMax + 50 {
		ids = append(ids, b.create(t, task.NewTask{Kind: "leaf"}).ID)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO ingest_task_dependency (task_id, depends_on) SELECT unnest($1::uuid[]), $2`, ids, root.ID); err != nil {
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
