package api_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
)

// TestEncryptedPayloads: a server with the key creates a task whose
// payload PostgreSQL holds encrypted and shows it in clear; a server on
// the same database without the key answers 200 with payload_encrypted
// naming the key id instead of the payload, and never the stored
// envelope or a key.
func TestEncryptedPayloads(t *testing.T) {
	t.Parallel()
	secret := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	kr, err := seal.Parse("k1:" + secret)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{keyring: kr})
	r := b.do(t, "POST", "/v1/tasks", `{"kind":"doc","payload":{"patient":"Grace Hopper"}}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	id := decode[api.CreateResponse](t, r).ID
	var stored string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT payload::text FROM ingest_task WHERE id = $1`, id).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, "Hopper") || seal.KeyIDOf([]byte(stored)) != "k1" {
		t.Fatalf("PostgreSQL holds %s; want an envelope under k1", stored)
	}
	// The run's result, written by a worker with the key.
	if _, err := b.store.Start(context.Background(), "w", time.Minute, id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.SucceedWith(context.Background(), "w", task.Success{ID: id, Result: json.RawMessage(`{"diagnosis":"ok"}`)}); err != nil {
		t.Fatal(err)
	}

	r = b.do(t, "GET", "/v1/tasks/"+id.String(), "")
	got := decode[api.TaskResponse](t, r)
	if r.code != http.StatusOK || string(got.Payload) != `{"patient":"Grace Hopper"}` || string(got.Result) != `{"diagnosis":"ok"}` || got.PayloadEncrypted != nil {
		t.Fatalf("GET with the key: %d %s", r.code, r.body)
	}

	for _, tc := range []struct {
		name    string
		kr      *seal.Keyring
		missing bool
	}{{"NoKey", nil, true}, {"WrongKey", mustKeyring(t, "k1:"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{8}, 32))), false}} {
		t.Run(tc.name, func(t *testing.T) {
			store, err := task.NewStore(task.Config{Keyring: tc.kr}, b.db.Pool)
			if err != nil {
				t.Fatal(err)
			}
			h, err := api.New(api.Config{}, store, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			other := &bundle{srv: srv}
			r := other.do(t, "GET", "/v1/tasks/"+id.String(), "")
			if r.code != http.StatusOK {
				t.Fatalf("GET without the key: %d %s; want 200", r.code, r.body)
			}
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(r.body, &raw); err != nil {
				t.Fatal(err)
			}
			var enc task.Encrypted
			if err := json.Unmarshal(raw["payload_encrypted"], &enc); err != nil || enc.KeyID != "k1" || enc.Missing != tc.missing {
				t.Fatalf("payload_encrypted = %s; want key_id k1, key_missing %v (body %s)", raw["payload_encrypted"], tc.missing, r.body)
			}
			if _, ok := raw["payload"]; ok || string(raw["result"]) != "null" || raw["result_encrypted"] == nil {
				t.Fatalf("body %s: want no payload, a null result and result_encrypted", r.body)
			}
			for _, leak := range []string{"Hopper", "diagnosis", `"ct"`, secret} {
				if strings.Contains(string(r.body), leak) {
					t.Fatalf("body %s shows %q", r.body, leak)
				}
			}
		})
	}
}

func mustKeyring(t *testing.T, spec string) *seal.Keyring {
	t.Helper()
	kr, err := seal.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}
