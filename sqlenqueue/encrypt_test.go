package sqlenqueue_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
)

// TestEncryptionOfSQLTasks holds the SQL functions to what
// docs/SQL-ENQUEUE.md says of encryption: they write the payload in clear
// (they hold no key); a store with keys reads it, and a Go create with
// dedup_by_payload matches it; 'keys rotate' (Store.Rotate) encrypts it in
// place, with its payload_sha, after which the store still reads and
// dedups it.
func TestEncryptionOfSQLTasks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	kr, err := seal.Parse("k1:" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{5}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	store := newStore(t, db, task.Config{Keyring: kr})
	var id uuid.UUID
	if err := db.QueryRow(ctx, `SELECT ingest_enqueue('doc', '{"card": "4111"}', '{"dedup_by_payload": true}')`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	var stored, sha string
	if err := db.QueryRow(ctx, `SELECT payload::text, payload_sha FROM ingest_task WHERE id = $1`, id).Scan(&stored, &sha); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stored, "4111") || strings.Contains(sha, ":") {
		t.Fatalf("the SQL function wrote %s, %s; want the payload in clear with its plain SHA-256", stored, sha)
	}
	same := task.NewTask{Kind: "doc", Payload: json.RawMessage(`{"card":"4111"}`), DedupByPayload: true}
	check := func(when string) {
		t.Helper()
		got, err := store.Get(ctx, id)
		if err != nil || string(got.Payload) != `{"card":"4111"}` && string(got.Payload) != `{"card": "4111"}` {
			t.Fatalf("%s: Get = %s, %v", when, got.Payload, err)
		}
		r, err := store.Create(ctx, same)
		if err != nil || !r.Existing || r.Task.ID != id {
			t.Fatalf("%s: a Go create of the same payload = %+v, %v; want the SQL task", when, r, err)
		}
	}
	check("in clear")
	rb, err := store.Rotate(ctx, uuid.Nil, 0, false)
	if err != nil || rb.Payloads != 1 {
		t.Fatalf("Rotate = %+v, %v; want the one payload encrypted", rb, err)
	}
	if err := db.QueryRow(ctx, `SELECT payload::text, payload_sha FROM ingest_task WHERE id = $1`, id).Scan(&stored, &sha); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, "4111") || seal.KeyIDOf([]byte(stored)) != "k1" || !strings.HasPrefix(sha, "k1:") {
		t.Fatalf("after the rotation: %s, %s; want an envelope under k1 and k1's digest", stored, sha)
	}
	check("after the rotation")
}
