package task

import (
	"bytes"
	"encoding/json"
	"errors"

	"github.com/ingest-worker/ingest/seal"
)

// This file owns where encryption at rest meets the store: payloads and
// results are sealed (package seal) by the statements that write them
// (createTx, SucceedWith) and opened where a task leaves the store with
// them (Get, Start, Create's existing tasks); payload_sha is the keyed
// digest of the keyring's first key when there is one. Rotation, which
// re-seals stored values under the first key, is rotate.go.

// Encrypted says that a stored payload or result could not be opened: it
// is encrypted with key KeyID, which the store does not hold (Missing), or
// under which it does not authenticate.
type Encrypted struct {
	KeyID   string `json:"key_id"`
	Missing bool   `json:"key_missing"`
	// Error says why, for people: it names the key id, never a key.
	Error string `json:"error"`
}

// Err returns the error an Encrypted stands for.
func (e *Encrypted) Err(f seal.Field) error {
	return &seal.OpenError{Field: f, KeyID: e.KeyID, Missing: e.Missing}
}

// ErrEncrypted is matched (errors.Is) by the error of a run whose payload
// could not be opened (PayloadError).
var ErrEncrypted = errors.New("encrypted with a key this process does not hold")

// PayloadError returns why the task's payload could not be opened, or
// nil: the error of a run that cannot be given its payload.
func (t *Task) PayloadError() error {
	if t.PayloadEncrypted == nil {
		return nil
	}
	return payloadError{t.PayloadEncrypted.Err(seal.Payload)}
}

type payloadError struct{ error }

func (e payloadError) Is(target error) bool { return target == ErrEncrypted }
func (e payloadError) Unwrap() error        { return e.error }

// openPayload replaces t's stored payload by its plaintext, or sets
// PayloadEncrypted when it cannot be opened. A task without a payload
// (none read, or already found encrypted) is left as it is.
func (s *Store) openPayload(t *Task) {
	if len(t.Payload) > 0 {
		t.Payload, t.PayloadEncrypted = s.open(seal.Payload, t, t.Payload)
	}
}

// openResult is openPayload for the result.
func (s *Store) openResult(t *Task) {
	if len(t.Result) > 0 {
		t.Result, t.ResultEncrypted = s.open(seal.Result, t, t.Result)
	}
}

func (s *Store) open(f seal.Field, t *Task, v json.RawMessage) (json.RawMessage, *Encrypted) {
	pt, err := s.cfg.Keyring.Open(f, t.ID, v)
	if err == nil {
		return pt, nil
	}
	var oe *seal.OpenError
	if errors.As(err, &oe) {
		return nil, &Encrypted{KeyID: oe.KeyID, Missing: oe.Missing, Error: oe.Error()}
	}
	return nil, &Encrypted{Error: err.Error()}
}

// dedupDigests returns every form the payload_sha of it's payload may
// have: the keyed digest under each key of the keyring (the first key's
// is it.sha) and the plain SHA-256 (tasks written without encryption, or
// by the SQL enqueue function, until a rotation rewrites them). Without a
// keyring that is it.sha alone.
func (s *Store) dedupDigests(it prepared) []string {
	if s.cfg.Keyring == nil {
		return []string{it.sha}
	}
	return s.cfg.Keyring.Digests(it.canonical)
}

// reservedMember reports whether a canonical JSON value is an object with
// a top-level "$enc" member, the envelope's mark, which a plaintext value
// may not carry.
func reservedMember(canonical []byte) bool {
	if len(canonical) == 0 || canonical[0] != '{' || !bytes.Contains(canonical, []byte(`"$enc"`)) {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(canonical, &m) != nil {
		return false
	}
	_, ok := m["$enc"]
	return ok
}
