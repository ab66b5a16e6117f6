package ui_test

import (
	"encoding/json"
	"testing"

	"github.com/ingest-worker/ingest/task"
)

// TestKindsPageBlockedSequences: the kinds page counts a kind's blocked
// sequences and lists each with a link to the DEAD task that holds it.
func TestKindsPageBlockedSequences(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	head := b.create(t, task.NewTask{Kind: "index", SequenceKey: "doc-<7>"})
	b.create(t, task.NewTask{Kind: "index", SequenceKey: "doc-<7>", Payload: json.RawMessage(`2`)})
	b.kill(t, head.ID, "bad document")
	c := b.client(t)
	want(t, c.get("/ui/kinds"), 200, "Blocked sequences", `href="#blocked"`, `href="/ui/tasks/`+head.ID.String()+`"`,
		"doc-&lt;7&gt;", "bad document")
	want(t, c.get("/ui/kinds?live=1"), 200, "Blocked sequences")
}
