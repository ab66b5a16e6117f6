package ui_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// TestTaskPageResultAndProgress: a task's page shows its progress and its
// result, escaped (markup as text, controls as visible escapes), and a
// large result cut with a note.
func TestTaskPageResultAndProgress(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	c := b.client(t)
	x := b.create(t, task.NewTask{Kind: "doc"})
	if _, err := b.store.Start(b.ctx, "w", time.Minute, x.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.store.SetProgress(b.ctx, task.ProgressReport{ID: x.ID, Attempt: 1, Percent: 42, Message: "<img src=x onerror=alert(1)> \u202eevil"}); err != nil {
		t.Fatal(err)
	}
	p := c.get("/ui/tasks/" + x.ID.String())
	want(t, p, 200, `id="progress">42%`, "&lt;img src=x onerror=alert(1)&gt;", `\u202e`)
	if strings.Contains(p.body, "<img src=x") || strings.Contains(p.body, "\u202e") {
		t.Fatalf("the progress message is not escaped:\n%s", clip(p.body))
	}
	big := `{"a": "<script>alert(1)</script>", "lines": [` + strings.Repeat(`"0123456789",`, 10000) + `"end"]}`
	if _, err := b.store.SucceedWith(b.ctx, "w", task.Success{ID: x.ID, Result: json.RawMessage(big)}); err != nil {
		t.Fatal(err)
	}
	p = c.get("/ui/tasks/" + x.ID.String())
	want(t, p, 200, `id="result"`, `&#34;a&#34;: &#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;`, `id="result-cut"`, "GET /v1/tasks/{id} returns all of it", `id="progress">42%`)
	if strings.Contains(p.body, "<script>alert") || strings.Contains(p.body, `"end"`) {
		t.Fatalf("the result is not escaped or not cut:\n%s", clip(p.body))
	}
}
