package bench_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/bench"
	"github.com/ingest-worker/ingest/webhook"
)

// TestSink: the sink answers 500 to exactly the first attempts that
// FailsFirstAttempt chooses, from the bytes of a task's UUID or of a River
// job's id, 204 to everything else, 400 to a body without a task id, and
// counts every request.
func TestSink(t *testing.T) {
	t.Parallel()
	const rate = 0.3
	sink, err := bench.StartSink(rate)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sink.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	client := &http.Client{}
	post := func(body any) int {
		t.Helper()
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Post(sink.URL(), "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	var sent, want500 int64
	check := func(what string, key []byte, body func(attempt int) any) {
		t.Helper()
		for attempt := 1; attempt <= 2; attempt++ {
			want := http.StatusNoContent
			if attempt == 1 && bench.FailsFirstAttempt(key, rate) {
				want = http.StatusInternalServerError
				want500++
			}
			sent++
			if got := post(body(attempt)); got != want {
				t.Errorf("%s, attempt %d: status %d, want %d", what, attempt, got, want)
			}
		}
	}
	for range 100 {
		id := uuid.New()
		check("task "+id.String(), id[:], func(attempt int) any {
			return webhook.Request{TaskID: id, Kind: "k", Payload: json.RawMessage(`{"bench":true}`), Attempt: attempt}
		})
	}
	for jobID := int64(1); jobID <= 100; jobID++ {
		key := binary.BigEndian.AppendUint64(nil, uint64(jobID))
		check("job "+strconv.FormatInt(jobID, 10), key, func(attempt int) any {
			return map[string]any{"task_id": strconv.FormatInt(jobID, 10), "kind": "k", "payload": map[string]any{}, "attempt": attempt}
		})
	}
	if want500 < 20 || want500 > 100 { // 60 expected
		t.Errorf("%d of 200 ids chosen at rate %v", want500, rate)
	}
	for _, bad := range []any{map[string]any{"attempt": 1}, map[string]any{"task_id": "x", "attempt": 1}, map[string]any{"task_id": "1"}} {
		sent++
		if got := post(bad); got != http.StatusBadRequest {
			t.Errorf("body %v: status %d, want 400", bad, got)
		}
	}
	if got := sink.Requests(); got != sent {
		t.Errorf("Requests() = %d, want %d", got, sent)
	}
	if got := sink.Failed(); got != want500 {
		t.Errorf("Failed() = %d, want %d", got, want500)
	}
	if got := sink.Connections(); got < 1 || got >= sent {
		t.Errorf("Connections() = %d for %d requests of one client, one at a time: want reuse", got, sent)
	}
}

// TestSinkWebhookRetryable: the webhook handler takes the sink's 500 for
// a failure to retry (not a permanent one, and without a Retry-After), and
// its 204 for success.
func TestSinkWebhookRetryable(t *testing.T) {
	t.Parallel()
	sink, err := bench.StartSink(0.5)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	h, err := webhook.New(webhook.Config{URL: sink.URL()})
	if err != nil {
		t.Fatal(err)
	}
	var failing, passing uuid.UUID
	for failing == uuid.Nil || passing == uuid.Nil {
		id := uuid.New()
		if bench.FailsFirstAttempt(id[:], 0.5) {
			failing = id
		} else {
			passing = id
		}
	}
	ctx := context.Background()
	err = h(ctx, ingest.Task{ID: failing, Kind: "k", Payload: json.RawMessage(`{}`), Attempt: 1})
	if err == nil || ingest.IsPermanent(err) {
		t.Errorf("first attempt of a failing task: %v, want a retryable error", err)
	}
	if _, ok := ingest.RetryDelay(err); ok {
		t.Errorf("first attempt of a failing task: %v carries a retry delay", err)
	}
	if err := h(ctx, ingest.Task{ID: failing, Kind: "k", Payload: json.RawMessage(`{}`), Attempt: 2}); err != nil {
		t.Errorf("second attempt of a failing task: %v", err)
	}
	if err := h(ctx, ingest.Task{ID: passing, Kind: "k", Payload: json.RawMessage(`{}`), Attempt: 1}); err != nil {
		t.Errorf("first attempt of a passing task: %v", err)
	}
	if got := sink.Requests(); got != 3 {
		t.Errorf("Requests() = %d, want 3", got)
	}
}

func TestStartSinkFailRate(t *testing.T) {
	t.Parallel()
	for _, rate := range []float64{-0.1, 1} {
		if s, err := bench.StartSink(rate); err == nil {
			s.Close()
			t.Errorf("StartSink(%v) accepted the rate", rate)
		}
	}
}
