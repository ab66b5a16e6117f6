package ingest_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/stream"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/webhook"
)

func testKeyring(t *testing.T, spec string) *seal.Keyring {
	t.Helper()
	kr, err := seal.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

var testKey1 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))

// TestWebhookEncrypted runs the webhook handler on a worker with a
// keyring: the receiver gets each payload in clear, PostgreSQL holds
// payloads and the receiver's results encrypted, and the store reads the
// results back in clear.
func TestWebhookEncrypted(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{Keyring: testKeyring(t, "k1:"+testKey1)})
		var mu sync.Mutex
		var bodies []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			bodies = append(bodies, string(body))
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"classified":"result-of-the-receiver"}`)
		}))
		defer srv.Close()
		h, err := webhook.NewResult(webhook.Config{URL: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		w, _ := bd.worker(ingest.Config{}, nil)
		w.HandleResult("doc", h)
		bd.run(w)
		ids := bd.enqueue("doc", 3, 0)
		bd.eventually(30*time.Second, "all SUCCEEDED", func() bool { return bd.countStatus(task.Succeeded) == 3 })
		mu.Lock()
		joined := strings.Join(bodies, "\n")
		mu.Unlock()
		for i := range 3 {
			if !strings.Contains(joined, fmt.Sprintf(`{"i":%d}`, i)) {
				t.Fatalf("the receiver got %s; want payload {\"i\":%d} in clear", joined, i)
			}
		}
		if strings.Contains(joined, `"$enc"`) {
			t.Fatalf("the receiver got an envelope: %s", joined)
		}
		var leaks int
		if err := bd.db.QueryRow(bd.ctx, `SELECT count(*) FROM ingest_task WHERE payload::text LIKE '%"i"%' OR result::text LIKE '%classified%'
		    OR payload->>'kid' IS DISTINCT FROM 'k1' OR result->>'kid' IS DISTINCT FROM 'k1'`).Scan(&leaks); err != nil || leaks != 0 {
			t.Fatalf("%d rows hold a payload or result in clear (%v)", leaks, err)
		}
		for _, id := range ids {
			if got := bd.task(id); string(got.Result) != `{"classified":"result-of-the-receiver"}` {
				t.Fatalf("result of %s = %s (%+v)", id, got.Result, got.ResultEncrypted)
			}
		}
	})
}

// TestMissingKeyIsAFailedAttempt runs tasks encrypted under k1 on a
// worker without that key: the handler is never called, each run is a
// failed attempt naming the key id, the task ends DEAD (in the DLQ, which
// holds no payload) with its payload intact, and a redrive onto a worker
// with the key runs it.
func TestMissingKeyIsAFailedAttempt(t *testing.T) {
	t.Parallel()
	testenv.RedisBackends(t, func(t *testing.T, b testenv.Backend) {
		t.Parallel()
		bd := setup(t, b, task.Config{Backoff: fastBackoff, Keyring: testKeyring(t, "k1:"+testKey1)})
		keyless, err := task.NewStore(task.Config{Stream: bd.stream, Backoff: fastBackoff}, bd.db)
		if err != nil {
			t.Fatal(err)
		}
		var calls atomic.Int32
		handler := func(_ context.Context, tk ingest.Task) error {
			calls.Add(1)
			if string(tk.Payload) != `{"i":0}` {
				return fmt.Errorf("payload %s", tk.Payload)
			}
			return nil
		}
		w, err := ingest.New(ingest.Config{Stream: bd.stream, DLQ: bd.dlq, Consumer: "keyless", Block: 100 * time.Millisecond,
			TaskLease: time.Second, ShutdownTimeout: 2 * time.Second, ReclaimIdle: time.Second}, keyless, bd.rdb, slog.New(bd.logs), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		w.Handle("doc", handler)
		stop := bd.run(w)
		bd.reclaim(w, time.Second)
		id := bd.enqueue("doc", 1, 2)[0]
		bd.eventually(20*time.Second, "DEAD", bd.statusIs(id, task.Dead))
		bd.eventually(5*time.Second, "one DLQ entry", func() bool { return len(bd.dlqEntries()) == 1 })
		stop()
		tk := bd.task(id)
		if calls.Load() != 0 || tk.AttemptCount != 2 || !strings.Contains(tk.LastError, `key id "k1"`) || string(tk.Payload) != `{"i":0}` {
			t.Fatalf("handler calls %d, attempt_count %d, last_error %q, payload %s; want no call, 2 failed attempts naming k1, the payload intact",
				calls.Load(), tk.AttemptCount, tk.LastError, tk.Payload)
		}
		for k, v := range bd.dlqEntries()[0].Values {
			if strings.Contains(fmt.Sprint(v), `"i"`) {
				t.Fatalf("DLQ field %s holds the payload: %v", k, v)
			}
		}
		// The key deployed: a redrive runs it.
		if _, err := bd.store.Redrive(bd.ctx, "op", id); err != nil {
			t.Fatal(err)
		}
		keyed, _ := bd.worker(ingest.Config{}, map[string]ingest.Handler{"doc": handler})
		bd.run(keyed)
		bd.add(stream.Entry{TaskID: id, Kind: "doc"}) // what the relay publishes
		bd.eventually(20*time.Second, "SUCCEEDED after the redrive", bd.statusIs(id, task.Succeeded))
		if calls.Load() != 1 {
			t.Fatalf("handler calls %d; want 1", calls.Load())
		}
	})
}
