package termsafe

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"email.send", "email.send"},
		{"héllo wörld ✓ 日本", "héllo wörld ✓ 日本"},
		{`C:\dir`, `C:\dir`},
		{"esc\x1b[2J\x1b]0;pwned\a", `esc\x1b[2J\x1b]0;pwned\a`},
		{"abc\u202edef", `abc\u202edef`},
		{"a\nb\tc\rd", `a\nb\tc\rd`},
		{"nul\x00del\x7f", `nul\x00del\x7f`},
		{"c1\u009b31m", `c1\u009b31m`},
		{"\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u2028\u2029",
			`\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u2028\u2029`},
		{"bad\xffbyte\xc3", `bad\xffbyte\xc3`},
		{"emoji 👩‍💻 zwj kept", "emoji 👩‍💻 zwj kept"},
	} {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestText(t *testing.T) {
	t.Parallel()
	in := "line 1\n\tline 2\x1b[31m\r\u202e"
	want := "line 1\n\tline 2\\x1b[31m\\r\\u202e"
	if got := Text(in); got != want {
		t.Fatalf("Text(%q) = %q, want %q", in, got, want)
	}
}

func TestJSON(t *testing.T) {
	t.Parallel()
	v := map[string]string{"kind": "esc\x1b[2J\u202e\u009b\x7f"}
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	got := JSON(raw)
	for _, bad := range []string{"\u202e", "\u009b", "\x7f", "\x1b"} {
		if strings.Contains(string(got), bad) {
			t.Fatalf("JSON(%s) = %s still holds %q", raw, got, bad)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["kind"] != v["kind"] {
		t.Fatalf("JSON(%s) = %s decodes to %q (%v), want %q", raw, got, back["kind"], err, v["kind"])
	}
	if plain := []byte(`{"a": "b"}`); &JSON(plain)[0] != &plain[0] {
		t.Fatal("JSON copied a document it did not change")
	}
}

// FuzzString: whatever s holds, String's result is one safe line of valid
// UTF-8, Text's is safe but for its new lines and tabs, both leave a safe
// string as it is, and JSON of an encoded s is safe and decodes to s (as
// valid UTF-8 makes it). Run: go test -run='^$' -fuzz='^FuzzString$' ./internal/termsafe
func FuzzString(f *testing.F) {
	for _, s := range []string{"", "plain", "esc\x1b[2J\x1b]0;pwned\a", "abc\u202edef", "a\nb", "\xff\xfe", "\u009b", "\x7f", "\u2028", "é\u0301"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		one := String(s)
		if !Safe(one) {
			t.Fatalf("String(%q) = %q is not safe", s, one)
		}
		if Safe(s) != (one == s) {
			t.Fatalf("String(%q) = %q: Safe says %v", s, one, Safe(s))
		}
		multi := Text(s)
		if !utf8.ValidString(multi) || !Safe(strings.NewReplacer("\n", "", "\t", "").Replace(multi)) {
			t.Fatalf("Text(%q) = %q is not safe", s, multi)
		}
		if Safe(s) && multi != s {
			t.Fatalf("Text changed the safe %q to %q", s, multi)
		}
		if strings.Count(multi, "\n") != strings.Count(s, "\n") {
			t.Fatalf("Text(%q) = %q: the new lines changed", s, multi)
		}
		raw, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		doc := JSON(raw)
		if !Safe(string(doc)) {
			t.Fatalf("JSON(%s) = %s is not safe", raw, doc)
		}
		var back string
		if err := json.Unmarshal(doc, &back); err != nil {
			t.Fatalf("JSON(%s) = %s: %v", raw, doc, err)
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); back != want && utf8.ValidString(s) {
			t.Fatalf("JSON(%s) = %s decodes to %q, want %q", raw, doc, back, want)
		}
	})
}
