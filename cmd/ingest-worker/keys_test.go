package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/task"
)

func testKey(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

// TestEncryptionCLI: task show with and without the key, keys rotate
// (dry run, run, idempotent re-run, unreadable values, no keys), and bad
// key lists refused with errors that name the entry and never show a key,
// in any output.
func TestEncryptionCLI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	stream, dlqKey := testenv.Keys(t)
	k1, k2 := testKey(1), testKey(2)
	base := map[string]string{"INGEST_DATABASE_URL": db.URL, "INGEST_REDIS_URL": testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY": stream, "INGEST_REDIS_DLQ_STREAM_KEY": dlqKey}
	with := func(keys string) map[string]string {
		env := maps.Clone(base)
		env["INGEST_ENCRYPTION_KEYS"] = keys
		return env
	}
	var outputs []string
	run := func(env map[string]string, args ...string) (int, string, string) {
		t.Helper()
		code, stdout, stderr := runCLI(t, env, args...)
		outputs = append(outputs, stdout, stderr)
		return code, stdout, stderr
	}
	kr, err := seal.Parse("k1:" + k1)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := task.NewStore(task.Config{Stream: stream, Keyring: kr}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := task.NewStore(task.Config{Stream: stream}, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sealed.Create(ctx, task.NewTask{Kind: "doc", Payload: json.RawMessage(`{"who":"Hedy Lamarr"}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Task.ID
	if _, err := sealed.Start(ctx, "w", time.Minute, id); err != nil {
		t.Fatal(err)
	}
	if _, err := sealed.SucceedWith(ctx, "w", task.Success{ID: id, Result: json.RawMessage(`{"patent":"granted"}`)}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := plain.Create(ctx, task.NewTask{Kind: "doc", Payload: json.RawMessage(`{"plain":true}`)}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("ShowWithKey", func(t *testing.T) {
		code, out, stderr := run(with("k1:"+k1), "task", "show", id.String())
		if code != 0 || !strings.Contains(out, "Hedy Lamarr") || !strings.Contains(out, "granted") {
			t.Fatalf("exit %d, %s %s; want the payload and result in clear", code, out, stderr)
		}
	})
	t.Run("ShowWithoutKey", func(t *testing.T) {
		code, out, stderr := run(base, "task", "show", id.String())
		if code != 0 || strings.Count(out, "encrypted with key id k1") != 2 || strings.Contains(out, "Hedy") || strings.Contains(out, "$enc") {
			t.Fatalf("exit %d, %s %s; want the key id instead of the payload", code, out, stderr)
		}
		code, out, _ = run(base, "task", "show", id.String(), "--json")
		if code != 0 || !strings.Contains(out, `"payload_encrypted": {`) || !strings.Contains(out, `"key_id": "k1"`) || !strings.Contains(out, `"result_encrypted"`) {
			t.Fatalf("--json: exit %d, %s", code, out)
		}
	})
	rotate := func(env map[string]string, args ...string) (int, rotateReport, string) {
		t.Helper()
		code, out, stderr := run(env, append([]string{"keys", "rotate", "--json", "--batch-size", "2"}, args...)...)
		var rep rotateReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("keys rotate: exit %d, %q %q: %v", code, out, stderr, err)
		}
		return code, rep, stderr
	}
	t.Run("Rotate", func(t *testing.T) {
		both := with("k2:" + k2 + ",k1:" + k1)
		code, dry, _ := rotate(both, "--dry-run")
		if code != 0 || dry.Scanned != 4 || dry.Payloads != 4 || dry.Results != 1 || !dry.DryRun || dry.KeyID != "k2" {
			t.Fatalf("dry run: exit %d, %+v; want 4 payloads and 1 result to re-encrypt", code, dry)
		}
		code, done, _ := rotate(both)
		if code != 0 || done.Payloads != 4 || done.Results != 1 {
			t.Fatalf("rotate: exit %d, %+v", code, done)
		}
		code, again, _ := rotate(both)
		if code != 0 || again.Payloads != 0 || again.Results != 0 || again.Scanned != 4 {
			t.Fatalf("second rotate: exit %d, %+v; want nothing to do", code, again)
		}
		code, resumed, _ := rotate(both, "--after", done.Next)
		if code != 0 || resumed.Scanned != 0 {
			t.Fatalf("rotate --after the last id: exit %d, %+v; want nothing scanned", code, resumed)
		}
		code, out, _ := run(with("k2:"+k2), "task", "show", id.String())
		if code != 0 || !strings.Contains(out, "Hedy Lamarr") || !strings.Contains(out, "granted") {
			t.Fatalf("show with k2 alone after the rotation: exit %d, %s", code, out)
		}
		code, out, _ = run(both, "keys", "rotate")
		if code != 0 || !strings.Contains(out, "key k2: 4 tasks scanned; re-encrypted: 0 payloads, 0 results") {
			t.Fatalf("rotate (table): exit %d, %q", code, out)
		}
	})
	t.Run("RotateUnreadable", func(t *testing.T) {
		code, rep, stderr := rotate(with("k3:" + testKey(3)))
		if code != exitRuntime || rep.Unreadable["k2"] != 5 || !strings.Contains(stderr, "5 under key id k2") {
			t.Fatalf("exit %d, %+v, %q; want exit 1 naming 5 values under k2", code, rep, stderr)
		}
	})
	t.Run("RotateWithoutKeys", func(t *testing.T) {
		code, _, stderr := run(base, "keys", "rotate")
		if code != exitUsage || !strings.Contains(stderr, "INGEST_ENCRYPTION_KEYS is empty") {
			t.Fatalf("exit %d, %q; want 2 naming INGEST_ENCRYPTION_KEYS", code, stderr)
		}
	})
	t.Run("BadKeys", func(t *testing.T) {
		short := base64.StdEncoding.EncodeToString([]byte("only sixteen....")) // 16 bytes
		for _, tc := range []struct{ keys, want string }{
			{"k1:" + short, `entry 1 (id "k1"): the key is 16 bytes, want 32`},
			{"k1:" + k1 + ",k2:%%" + k2, `entry 2 (id "k2"): the key is not valid base64`},
			{"k1:" + k1 + ",k1:" + k2, `key id "k1" is given twice`},
			{"k/1:" + k1, `key id "k/1" has a character`},
		} {
			for _, args := range [][]string{{"task", "list"}, {"keys", "rotate"}, {"config"}} {
				code, _, stderr := run(with(tc.keys), args...)
				if code != exitUsage || !strings.Contains(stderr, "INGEST_ENCRYPTION_KEYS") || !strings.Contains(stderr, tc.want) {
					t.Fatalf("%v with %q: exit %d, %q; want 2 and %q", args, tc.want, code, stderr, tc.want)
				}
			}
		}
		_, _, stderr := run(base, "--encryption-keys", "k1:"+short, "task", "list")
		if !strings.Contains(stderr, "the key is 16 bytes") {
			t.Fatalf("the flag: %q", stderr)
		}
	})
	t.Run("ConfigRedacts", func(t *testing.T) {
		code, out, stderr := run(with("k1:"+k1), "config")
		if code != 0 || !strings.Contains(out, "INGEST_ENCRYPTION_KEYS") {
			t.Fatalf("config: exit %d, %q %q", code, out, stderr)
		}
	})
	// No output of any command above shows a key, whole or unpadded.
	for _, secret := range []string{k1, k2, testKey(3), strings.TrimRight(k1, "="), strings.TrimRight(k2, "=")} {
		for _, o := range outputs {
			if strings.Contains(o, secret) {
				t.Fatalf("an output shows a key:\n%s", o)
			}
		}
	}
}
