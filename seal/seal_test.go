package seal_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/seal"
)

func key(b byte) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)) }

var (
	id1 = [16]byte{1}
	id2 = [16]byte{2}
)

func mustParse(t *testing.T, spec string) *seal.Keyring {
	t.Helper()
	r, err := seal.Parse(spec)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return r
}

// TestParse checks the key list's form and that no error shows a key.
func TestParse(t *testing.T) {
	t.Parallel()
	k1, k2 := key(1), key(2)
	short := base64.StdEncoding.EncodeToString([]byte("sixteen bytes!!!"))
	for _, tc := range []struct {
		name, spec, want string
		ids              []string
	}{
		{name: "Empty", spec: "  "},
		{name: "One", spec: "k1:" + k1, ids: []string{"k1"}},
		{name: "TwoFirstEncrypts", spec: " k2:" + k2 + " , k1:" + k1, ids: []string{"k2", "k1"}},
		{name: "Unpadded", spec: "k1:" + strings.TrimRight(k1, "="), ids: []string{"k1"}},
		{name: "BadBase64", spec: "k1:" + k1 + ",k2:not*base64" + k2, want: `entry 2 (id "k2"): the key is not valid base64`},
		{name: "WrongLength", spec: "k1:" + short, want: `entry 1 (id "k1"): the key is 16 bytes, want 32`},
		{name: "DuplicateID", spec: "k1:" + k1 + ",k1:" + k2, want: `key 2: key id "k1" is given twice`},
		{name: "BadIDCharacter", spec: "k 1:" + k1, want: `entry 1: key id "k 1" has a character other than`},
		{name: "EmptyID", spec: ":" + k1, want: "entry 1: key id is empty"},
		{name: "NoColon", spec: k1, want: "entry 1 has no ':'"},
		{name: "EmptyEntry", spec: "k1:" + k1 + ",", want: "entry 2 is empty"},
		{name: "LongID", spec: strings.Repeat("k", 33) + ":" + k1, want: "key id is 33 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := seal.Parse(tc.spec)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Parse error = %v; want one containing %q", err, tc.want)
				}
				for _, secret := range []string{k1, k2, strings.TrimRight(k1, "="), short} {
					if strings.Contains(err.Error(), secret) {
						t.Fatalf("the error %q shows a key", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := r.IDs(); fmt.Sprint(got) != fmt.Sprint(tc.ids) {
				t.Fatalf("IDs = %v; want %v", got, tc.ids)
			}
			for _, s := range []string{r.String(), fmt.Sprintf("%v %+v %#v", r, r, r)} {
				if strings.Contains(s, k1) || strings.Contains(s, k2) {
					t.Fatalf("the keyring formats as %q, showing a key", s)
				}
			}
		})
	}
}

// TestSealOpen checks the round trip, the envelope's form, and that a
// ciphertext opens only for its task, its field and its key.
func TestSealOpen(t *testing.T) {
	t.Parallel()
	r := mustParse(t, "k2:"+key(2)+",k1:"+key(1))
	pt := []byte(`{"name":"Ada","n":1}`)
	env, err := r.Seal(seal.Payload, id1, pt)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(env, []byte("Ada")) || !json.Valid(env) {
		t.Fatalf("envelope %s shows the plaintext or is not JSON", env)
	}
	e, err := seal.ParseEnvelope(env)
	if err != nil || e.Enc != "v1" || e.KeyID != "k2" || seal.KeyIDOf(env) != "k2" {
		t.Fatalf("ParseEnvelope = %+v, %v; want v1 under k2", e, err)
	}
	again, _ := r.Seal(seal.Payload, id1, pt)
	if bytes.Equal(env, again) {
		t.Fatal("two seals of one value are equal: the nonce is not fresh")
	}
	if got, err := r.Open(seal.Payload, id1, env); err != nil || !bytes.Equal(got, pt) {
		t.Fatalf("Open = %s, %v; want %s", got, err, pt)
	}
	// Plaintext passes through, with or without a keyring.
	var none *seal.Keyring
	for _, kr := range []*seal.Keyring{r, none} {
		if got, err := kr.Open(seal.Payload, id1, pt); err != nil || !bytes.Equal(got, pt) {
			t.Fatalf("Open(plaintext) = %s, %v", got, err)
		}
	}
	refused := func(name string, kr *seal.Keyring, f seal.Field, id [16]byte, v []byte, missing bool) {
		t.Helper()
		_, err := kr.Open(f, id, v)
		var oe *seal.OpenError
		if !errors.As(err, &oe) || oe.Missing != missing {
			t.Fatalf("%s: Open error = %v; want an OpenError (missing %v)", name, err, missing)
		}
	}
	refused("another task", r, seal.Payload, id2, env, false)
	refused("another field", r, seal.Result, id1, env, false)
	refused("no keyring", none, seal.Payload, id1, env, true)
	refused("a keyring without k2", mustParse(t, "k1:"+key(1)), seal.Payload, id1, env, true)
	refused("another key under k2", mustParse(t, "k2:"+key(9)), seal.Payload, id1, env, false)
	// Relabelled with the other key id: the key id is authenticated.
	relabelled := bytes.Replace(env, []byte(`"kid":"k2"`), []byte(`"kid":"k1"`), 1)
	refused("relabelled", r, seal.Payload, id1, relabelled, false)
	// A truncated ciphertext.
	e.CT = e.CT[:8]
	short, _ := json.Marshal(e)
	refused("truncated", r, seal.Payload, id1, short, false)
}

// TestParseEnvelopeStrict checks that only an object of exactly the
// envelope's members is taken for one.
func TestParseEnvelopeStrict(t *testing.T) {
	t.Parallel()
	for _, v := range []string{`{"$enc":"v2","kid":"k","ct":"AA=="}`, `{"$enc":"v1","kid":"k"}`,
		`{"$enc":"v1","kid":"k","ct":"AA==","x":1}`, `{"$enc":"v1","kid":1,"ct":"AA=="}`, `["$enc"]`, `"$enc"`, `{}`} {
		if _, err := seal.ParseEnvelope([]byte(v)); !errors.Is(err, seal.ErrNotSealed) {
			t.Errorf("ParseEnvelope(%s) = %v; want ErrNotSealed", v, err)
		}
	}
}

// TestResealAndDigest checks that Reseal moves a value to the first key,
// leaves one there alone, and that digests are keyed and tagged.
func TestResealAndDigest(t *testing.T) {
	t.Parallel()
	old := mustParse(t, "k1:"+key(1))
	both := mustParse(t, "k2:"+key(2)+",k1:"+key(1))
	pt := []byte(`[1,2]`)
	env1, _ := old.Seal(seal.Result, id1, pt)
	env2, changed, err := both.Reseal(seal.Result, id1, env1)
	if err != nil || !changed || seal.KeyIDOf(env2) != "k2" {
		t.Fatalf("Reseal = %s, %v, %v; want it under k2", env2, changed, err)
	}
	if got, err := both.Open(seal.Result, id1, env2); err != nil || !bytes.Equal(got, pt) {
		t.Fatalf("Open after Reseal = %s, %v", got, err)
	}
	if same, changed, err := both.Reseal(seal.Result, id1, env2); err != nil || changed || !bytes.Equal(same, env2) {
		t.Fatalf("Reseal of a value under the first key = %v, %v; want it unchanged", changed, err)
	}
	if fromPlain, changed, err := both.Reseal(seal.Result, id1, pt); err != nil || !changed || seal.KeyIDOf(fromPlain) != "k2" {
		t.Fatalf("Reseal of plaintext = %s, %v, %v", fromPlain, changed, err)
	}
	d := both.Digest(pt)
	if !strings.HasPrefix(d, "k2:") || d == old.Digest(pt) || d != both.Digest(pt) {
		t.Fatalf("Digest = %q (k1's %q); want a stable k2: digest differing from k1's", d, old.Digest(pt))
	}
	ds := both.Digests(pt)
	var none *seal.Keyring
	if len(ds) != 3 || ds[0] != d || ds[1] != old.Digest(pt) || ds[2] != none.Digest(pt) {
		t.Fatalf("Digests = %v; want k2's, k1's and the plain SHA-256", ds)
	}
}
