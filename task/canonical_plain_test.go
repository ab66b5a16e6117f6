package task

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// plainSeeds are inputs for the comparison of canonicalPlain with
// canonicalDecoded: the plain cases, each thing the plain pass leaves to
// the decoder, and inputs that are not JSON.
var plainSeeds = []string{
	`{"b":1,"a":[1,2,{"y":"é","x":null}],"c":true,"d":false}`,
	` {"z" : { "y":1 , "x":[ ] } , "a":{ } } `,
	`{"b":1,"a":2,"b":3}`, `{"a":1,"a":2}`, `{"a":{"b":1,"b":2}}`,
	`"a\"b"`, `"\u00e9"`, `{"\u0061":1,"a":2}`, `"\u0000"`, "\"\u2028\"", "\"\u2029\"", "\"\xff\"", "\"\xe2\x82\"",
	`0`, `-0`, `1.0`, `1e2`, `1E+2`, `-1.5e-3`, `12345678901234567890123`, `01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`, `0x1`,
	`true`, `false`, `null`, `tru`, `nul`, `True`,
	`{"a":1,}`, `[1,]`, `[,1]`, `{"a" 1}`, `{1:2}`, `{"a":1}x`, `{} {}`, `[`, `]`, `{`, `"abc`, "\"a\tb\"", "\ufeff{}",
	strings.Repeat("[", 300) + strings.Repeat("]", 300),
	strings.Repeat(`{"a":`, 250) + "1" + strings.Repeat("}", 250),
	`{"é":1,"e":2,"z":3,"É":4,"":5}`, `{"B":1,"a":2,"A":3,"b":4}`,
}

// checkPlain fails t when canonicalPlain takes in and its result is not
// canonicalDecoded's.
func checkPlain(t *testing.T, in []byte) {
	t.Helper()
	got, ok := canonicalPlain(in)
	if !ok {
		return
	}
	want, err := canonicalDecoded(in)
	if err != nil {
		t.Fatalf("canonicalPlain took %q, which canonicalDecoded refuses: %v", in, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("canonicalPlain(%q) = %q, canonicalDecoded gives %q", in, got, want)
	}
}

func TestCanonicalPlainMatchesDecoded(t *testing.T) {
	t.Parallel()
	for _, s := range plainSeeds {
		checkPlain(t, []byte(s))
	}
	// Random JSON and damaged JSON.
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		in := []byte(randomJSON(r, 0))
		if r.IntN(4) == 0 {
			in = damage(r, in)
		}
		checkPlain(t, in)
	}
}

func TestCanonicalPlainTakesPlainPayloads(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"document":"` + strings.Repeat("lorem ipsum ", 200) + `","id":17,"tags":["a","b"],"meta":{"z":1,"a":-2.5e3}}`,
		`[1,"é",null,true,{"k":"v"}]`, `"x"`, `0`, " {\n \"b\" : 1 ,\n \"a\" : 2 \n} ",
	} {
		if _, ok := canonicalPlain([]byte(in)); !ok {
			t.Errorf("canonicalPlain(%q) left it to the decoder", in)
		}
	}
	for _, in := range []string{`"a\nb"`, `{"a":1,"a":2}`, "\"\u2028\"", "\"\xff\"", `{"a":1}x`, strings.Repeat("[", plainDepth+1) + strings.Repeat("]", plainDepth+1)} {
		if _, ok := canonicalPlain([]byte(in)); ok {
			t.Errorf("canonicalPlain(%q) took it", in)
		}
	}
}

func FuzzCanonicalPlain(f *testing.F) {
	for _, s := range plainSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkPlain(t, in) })
}

// randomJSON returns a random JSON value with random white space: keys
// from a small set (so objects repeat and reorder them), strings with and
// without escapes and with characters the encoder escapes or replaces.
func randomJSON(r *rand.Rand, depth int) string {
	ws := func() string { return []string{"", "", " ", "\n", "\t ", "\r\n"}[r.IntN(6)] }
	kind := r.IntN(8)
	if depth > 4 && kind < 2 {
		kind = 2 + r.IntN(6)
	}
	// list writes up to four elements from elem between opener and closer.
	list := func(opener, closer string, elem func() string) string {
		var b strings.Builder
		b.WriteString(opener + ws())
		for i := range r.IntN(5) {
			if i > 0 {
				b.WriteString("," + ws())
			}
			b.WriteString(elem())
		}
		return b.String() + ws() + closer
	}
	switch kind {
	case 0:
		return list("{", "}", func() string { return randomString(r) + ws() + ":" + ws() + randomJSON(r, depth+1) })
	case 1:
		return list("[", "]", func() string { return randomJSON(r, depth+1) })
	case 2, 3:
		return randomString(r)
	case 4, 5:
		return []string{"0", "-0", "17", "-3.25", "1e9", "2.5E-3", "1E+2", "12345678901234567890"}[r.IntN(8)]
	default:
		return []string{"true", "false", "null"}[r.IntN(3)]
	}
}

// randomString returns a quoted JSON string, mostly plain.
func randomString(r *rand.Rand) string {
	parts := []string{"a", "b", "B", "é", "日本", "x y", `\n`, `\"`, `\\`, `\u0041`, `\u00e9`, "\u2028", "\xff", `\/`, "<&>", "A", ""}
	var b strings.Builder
	b.WriteByte('"')
	for range r.IntN(4) {
		p := parts[r.IntN(len(parts))]
		if r.IntN(3) > 0 {
			p = parts[r.IntN(3)] // mostly plain keys from a few letters
		}
		b.WriteString(p)
	}
	b.WriteByte('"')
	return b.String()
}

// damage changes in at random: cuts it, drops or doubles a byte, or puts
// a random byte in.
func damage(r *rand.Rand, in []byte) []byte {
	if len(in) == 0 {
		return in
	}
	i := r.IntN(len(in))
	switch r.IntN(4) {
	case 0:
		return in[:i]
	case 1:
		return append(in[:i:i], in[i+1:]...)
	case 2:
		return append(in[:i+1:i+1], in[i:]...)
	default:
		out := bytes.Clone(in)
		out[i] = byte(r.IntN(256))
		return out
	}
}

// BenchmarkCanonical is Canonical on a 2 KB document payload, plain and
// with an escape in it (which takes the decoder).
func BenchmarkCanonical(b *testing.B) {
	doc := `{"id":17,"document":"` + strings.Repeat("lorem ipsum ", 170) + `","tags":["a","b"],"meta":{"source":"s3","size":2048}}`
	for _, bc := range []struct{ name, in string }{{"plain", doc}, {"escaped", strings.Replace(doc, "lorem", `lo\nrem`, 1)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.in)))
			for b.Loop() {
				if _, err := Canonical([]byte(bc.in)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
