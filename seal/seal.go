package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// KeySize is the size of a key: AES-256.
const KeySize = 32

// MaxKeyIDLength bounds a key id.
const MaxKeyIDLength = 32

// Version is the envelope's "$enc" value.
const Version = "v1"

// Field names the column a sealed value belongs to; it is part of the
// associated data.
type Field string

// The fields package task seals.
const (
	Payload Field = "payload"
	Result  Field = "result"
)

// ErrNotSealed is returned by Parse for a value that is not an envelope.
var ErrNotSealed = errors.New("not an encrypted envelope")

// OpenError is why a sealed value could not be opened: its key is not in
// the keyring (Missing), or the value does not authenticate under it.
type OpenError struct {
	Field   Field
	KeyID   string
	Missing bool
}

func (e *OpenError) Error() string {
	if e.Missing {
		return fmt.Sprintf("%s is encrypted with key id %q, which is not among this process's encryption keys", e.Field, e.KeyID)
	}
	return fmt.Sprintf("%s is encrypted with key id %q but does not decrypt with that key (a different key under the same id, or a ciphertext that belongs to another task)", e.Field, e.KeyID)
}

type key struct {
	id     string
	aead   cipher.AEAD
	digest []byte // the HMAC key of Digest, derived from the key
}

// Keyring holds the keys: the first encrypts, all decrypt.
type Keyring struct {
	keys []*key
	byID map[string]*key
}

// Key is one key given to New: its id and its 32 bytes.
type Key struct {
	ID     string
	Secret []byte
}

// String never shows the secret.
func (k Key) String() string { return "key " + k.ID }

// GoString never shows the secret.
func (k Key) GoString() string { return "seal.Key{ID: " + fmt.Sprintf("%q", k.ID) + "}" }

// New returns a keyring of keys, the first of which encrypts. It refuses
// none, a bad id, a duplicate id and a secret that is not KeySize bytes.
func New(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("no keys")
	}
	r := &Keyring{byID: make(map[string]*key, len(keys))}
	for i, k := range keys {
		if err := CheckID(k.ID); err != nil {
			return nil, fmt.Errorf("key %d: %w", i+1, err)
		}
		if _, dup := r.byID[k.ID]; dup {
			return nil, fmt.Errorf("key %d: key id %q is given twice", i+1, k.ID)
		}
		if len(k.Secret) != KeySize {
			return nil, fmt.Errorf("key %d (id %q): is %d bytes, want %d (AES-256)", i+1, k.ID, len(k.Secret), KeySize)
		}
		block, err := aes.NewCipher(k.Secret)
		if err != nil {
			return nil, fmt.Errorf("key %d (id %q): %v", i+1, k.ID, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("key %d (id %q): %v", i+1, k.ID, err)
		}
		m := hmac.New(sha256.New, k.Secret)
		m.Write([]byte("ingest-worker payload_sha v1"))
		kk := &key{id: k.ID, aead: aead, digest: m.Sum(nil)}
		r.keys = append(r.keys, kk)
		r.byID[k.ID] = kk
	}
	return r, nil
}

// CheckID checks a key id: 1 to MaxKeyIDLength letters, digits, '_', '-'
// or '.'.
func CheckID(id string) error {
	if id == "" {
		return errors.New("key id is empty")
	}
	if len(id) > MaxKeyIDLength {
		return fmt.Errorf("key id is %d characters, at most %d", len(id), MaxKeyIDLength)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("key id %q has a character other than letters, digits, '_', '-' and '.'", strings.ToValidUTF8(id, "?"))
		}
	}
	return nil
}

// Parse reads a key list, "id:base64,id:base64,..." (standard base64 of
// 32 bytes, padded or not; white space around entries ignored). An empty
// list is nil: encryption off. Errors name the entry by position and id,
// never its key.
func Parse(spec string) (*Keyring, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	var keys []Key
	for i, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		n := i + 1
		id, b64, ok := strings.Cut(entry, ":")
		id = strings.TrimSpace(id)
		switch {
		case entry == "":
			return nil, fmt.Errorf("entry %d is empty (want id:base64-of-32-bytes)", n)
		case !ok:
			return nil, fmt.Errorf("entry %d has no ':' (want id:base64-of-32-bytes)", n)
		}
		if err := CheckID(id); err != nil {
			return nil, fmt.Errorf("entry %d: %w", n, err)
		}
		b64 = strings.TrimRight(strings.TrimSpace(b64), "=")
		secret, err := base64.RawStdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("entry %d (id %q): the key is not valid base64 (generate one with: openssl rand -base64 32)", n, id)
		}
		if len(secret) != KeySize {
			return nil, fmt.Errorf("entry %d (id %q): the key is %d bytes, want %d (generate one with: openssl rand -base64 32)", n, id, len(secret), KeySize)
		}
		keys = append(keys, Key{ID: id, Secret: secret})
	}
	r, err := New(keys...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Primary returns the id of the key that encrypts ("" for a nil keyring).
func (r *Keyring) Primary() string {
	if r == nil {
		return ""
	}
	return r.keys[0].id
}

// IDs returns the key ids, the encrypting one first.
func (r *Keyring) IDs() []string {
	if r == nil {
		return nil
	}
	ids := make([]string, len(r.keys))
	for i, k := range r.keys {
		ids[i] = k.id
	}
	return ids
}

// Has reports whether the keyring holds a key of id.
func (r *Keyring) Has(id string) bool {
	if r == nil {
		return false
	}
	_, ok := r.byID[id]
	return ok
}

// String shows the key ids only.
func (r *Keyring) String() string {
	if r == nil {
		return "no encryption keys"
	}
	return "encryption keys " + strings.Join(r.IDs(), ",")
}

// GoString shows the key ids only.
func (r *Keyring) GoString() string { return r.String() }

// Envelope is a sealed value as stored.
type Envelope struct {
	Enc   string `json:"$enc"`
	KeyID string `json:"kid"`
	CT    string `json:"ct"`
}

// ParseEnvelope returns the envelope of a stored value, or ErrNotSealed when the
// value is not one (plaintext).
func ParseEnvelope(value []byte) (Envelope, error) {
	v := bytes.TrimSpace(value)
	if len(v) == 0 || v[0] != '{' || !bytes.Contains(v, []byte(`"$enc"`)) {
		return Envelope{}, ErrNotSealed
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil || len(m) != 3 {
		return Envelope{}, ErrNotSealed
	}
	var e Envelope
	for name, dst := range map[string]*string{"$enc": &e.Enc, "kid": &e.KeyID, "ct": &e.CT} {
		raw, ok := m[name]
		if !ok || json.Unmarshal(raw, dst) != nil {
			return Envelope{}, ErrNotSealed
		}
	}
	if e.Enc != Version {
		return Envelope{}, ErrNotSealed
	}
	return e, nil
}

// KeyIDOf returns the key id of a sealed value, or "" for plaintext.
func KeyIDOf(value []byte) string {
	e, err := ParseEnvelope(value)
	if err != nil {
		return ""
	}
	return e.KeyID
}

// ad is the associated data of a sealed value: a version label, the
// field and a NUL (no field holds one), the task id's 16 bytes, and the
// key id last, so that no two (field, task, key id) give the same bytes.
func ad(f Field, taskID [16]byte, kid string) []byte {
	b := make([]byte, 0, 64)
	b = append(b, "ingest-worker seal v1\x00"...)
	b = append(b, f...)
	b = append(b, 0)
	b = append(b, taskID[:]...)
	b = append(b, kid...)
	return b
}

// Seal encrypts the JSON value plaintext of field f of task taskID under
// the first key and returns its envelope. A nil keyring returns
// plaintext.
func (r *Keyring) Seal(f Field, taskID [16]byte, plaintext []byte) ([]byte, error) {
	if r == nil {
		return plaintext, nil
	}
	return r.sealWith(r.keys[0], f, taskID, plaintext)
}

func (r *Keyring) sealWith(k *key, f Field, taskID [16]byte, plaintext []byte) ([]byte, error) {
	nonce := make([]byte, k.aead.NonceSize(), k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("seal %s: nonce: %w", f, err)
	}
	ct := k.aead.Seal(nonce, nonce, plaintext, ad(f, taskID, k.id))
	return json.Marshal(Envelope{Enc: Version, KeyID: k.id, CT: base64.StdEncoding.EncodeToString(ct)})
}

// Open returns the plaintext of a stored value of field f of task taskID:
// a plaintext value as it is, an envelope decrypted. The error of an
// envelope that does not open is an *OpenError.
func (r *Keyring) Open(f Field, taskID [16]byte, value []byte) ([]byte, error) {
	e, err := ParseEnvelope(value)
	if err != nil {
		return value, nil
	}
	var k *key
	if r != nil {
		k = r.byID[e.KeyID]
	}
	if k == nil {
		return nil, &OpenError{Field: f, KeyID: e.KeyID, Missing: true}
	}
	ct, err := base64.StdEncoding.DecodeString(e.CT)
	if err != nil || len(ct) < k.aead.NonceSize()+k.aead.Overhead() {
		return nil, &OpenError{Field: f, KeyID: e.KeyID}
	}
	n := k.aead.NonceSize()
	pt, err := k.aead.Open(nil, ct[:n], ct[n:], ad(f, taskID, e.KeyID))
	if err != nil {
		return nil, &OpenError{Field: f, KeyID: e.KeyID}
	}
	return pt, nil
}

// Digest returns the keyed digest of a canonical payload under the first
// key, "kid:" and the hex HMAC-SHA-256 with a key derived from it. A nil
// keyring returns the plain hex SHA-256. It stands for payload_sha: equal
// payloads have equal digests under one key, and a digest tells nothing of
// the payload to whoever lacks the key (a plain SHA-256 of a guessable
// payload can be confirmed by hashing guesses).
func (r *Keyring) Digest(canonical []byte) string {
	if r == nil {
		sum := sha256.Sum256(canonical)
		return hex.EncodeToString(sum[:])
	}
	return digest(r.keys[0], canonical)
}

// Digests returns the digests of canonical under every key, the first
// key's first, then the plain SHA-256: every form a payload_sha of the
// same payload may have been written in by a process of this keyring's
// keys (or of none).
func (r *Keyring) Digests(canonical []byte) []string {
	var out []string
	if r != nil {
		for _, k := range r.keys {
			out = append(out, digest(k, canonical))
		}
	}
	sum := sha256.Sum256(canonical)
	return append(out, hex.EncodeToString(sum[:]))
}

func digest(k *key, canonical []byte) string {
	m := hmac.New(sha256.New, k.digest)
	m.Write(canonical)
	return k.id + ":" + hex.EncodeToString(m.Sum(nil))
}

// Reseal returns a stored value of field f of task taskID sealed under the
// first key, and whether that changed it: a value already under the first
// key is returned as it is, plaintext and a value under another key of the
// keyring are (re)sealed. A nil keyring changes nothing.
func (r *Keyring) Reseal(f Field, taskID [16]byte, value []byte) ([]byte, bool, error) {
	if r == nil {
		return value, false, nil
	}
	if KeyIDOf(value) == r.keys[0].id {
		return value, false, nil
	}
	pt, err := r.Open(f, taskID, value)
	if err != nil {
		return nil, false, err
	}
	out, err := r.sealWith(r.keys[0], f, taskID, pt)
	return out, err == nil, err
}
