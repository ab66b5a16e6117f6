package ui_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/ui"
)

// TestEncryptedTaskPage: a dashboard with the key shows a task's payload
// and result in clear; one without it shows "encrypted" and the key id,
// and neither the plaintext, the stored envelope nor a key.
func TestEncryptedTaskPage(t *testing.T) {
	t.Parallel()
	secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	kr, err := seal.Parse("k1:" + secret)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{keyring: kr})
	r, err := b.store.Create(b.ctx, task.NewTask{Kind: "doc", Payload: json.RawMessage(`{"customer":"Katherine Johnson"}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Task.ID
	if _, err := b.store.Start(b.ctx, "w", time.Minute, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SucceedWith(b.ctx, "w", task.Success{ID: id, Result: json.RawMessage(`{"orbit":"computed"}`)}); err != nil {
		t.Fatal(err)
	}
	c := b.client(t)
	want(t, c.get("/ui/tasks/"+id.String()), 200, "Katherine Johnson", "computed")

	keyless, err := task.NewStore(task.Config{}, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.New(ui.Config{Store: keyless, DB: b.pool, Redis: b.rdb, Stream: b.stream, Group: "ingest-workers",
		DLQKey: b.dlqKey, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	other := (&bundle{srv: srv}).client(t)
	p := other.get("/ui/tasks/" + id.String())
	want(t, p, 200, `<span id="payload-encrypted">encrypted</span>`, `<span id="result-encrypted">encrypted</span>`, "<code>k1</code>")
	for _, leak := range []string{"Katherine", "orbit", "$enc", secret} {
		if strings.Contains(p.body, leak) {
			t.Fatalf("the page without the key shows %q", leak)
		}
	}
}
