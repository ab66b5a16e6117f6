package webhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/tracing"
	"github.com/ingest-worker/ingest/webhook"
)

// TestPostCarriesTheTraceparentOfItsContext: with tracing off (no
// provider installed in this test binary) the POST still carries the
// traceparent of the span in the handler's context, and none without one.
func TestPostCarriesTheTraceparentOfItsContext(t *testing.T) {
	t.Parallel()
	got := make(chan string, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
	}))
	t.Cleanup(srv.Close)
	h, err := webhook.New(webhook.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tk := ingest.Task{ID: uuid.New(), Kind: "k", Payload: []byte(`{}`), Attempt: 1}
	if err := h(tracing.Extract(context.Background(), tp), tk); err != nil {
		t.Fatal(err)
	}
	if h := <-got; h != tp {
		t.Errorf("traceparent header %q, want %q", h, tp)
	}
	if err := h(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
	if h := <-got; h != "" {
		t.Errorf("traceparent header %q without a span in the context, want none", h)
	}
}
