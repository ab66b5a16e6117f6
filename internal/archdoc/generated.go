package archdoc

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// UpdateEnv is the variable that makes the documentation tests rewrite
// the generated parts of the documents instead of failing on drift.
const UpdateEnv = "INGEST_UPDATE_DOCS"

// Updating reports whether UpdateEnv asks the tests to rewrite the
// generated parts of the documents.
func Updating() bool { return os.Getenv(UpdateEnv) == "1" }

// beginMarker and endMarker enclose a generated region of a Markdown
// document; the begin marker says how to regenerate it. Both are HTML
// comments, invisible in the rendered document.
func beginMarker(name, regen string) string {
	return fmt.Sprintf("<!-- generated: %s; do not edit, change the code and run: %s -->", name, regen)
}

func endMarker(name string) string { return "<!-- end generated: " + name + " -->" }

// CheckGenerated checks that the region called name of the Markdown
// document at path holds want, the text generated from the code. On a
// difference it fails t with regen, the command that rewrites the region,
// or, when Updating, rewrites the region in place. The document must hold
// the region's two markers (a new document gets them from the first run
// with UpdateEnv=1 when it holds the line "<!-- generated: NAME -->").
func CheckGenerated(t testing.TB, path, name, want, regen string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	begin, end := beginMarker(name, regen), endMarker(name)
	want = strings.TrimSuffix(want, "\n") + "\n"
	region := begin + "\n" + want + end

	var from, to int // the region's bytes in doc
	i := strings.Index(doc, "<!-- generated: "+name+";")
	j := strings.Index(doc, end)
	switch {
	case i >= 0 && j > i:
		from, to = i, j+len(end)
	case Updating():
		// A new region: its placeholder is the bare begin marker.
		placeholder := "<!-- generated: " + name + " -->"
		if from = strings.Index(doc, placeholder); from < 0 {
			t.Fatalf("%s has no generated region %q: add the line %s where it goes, then run: %s", path, name, placeholder, regen)
		}
		to = from + len(placeholder)
	default:
		t.Fatalf("%s has no generated region %q between %q and %q; run: %s", path, name, begin, end, regen)
	}
	if doc[from:to] == region {
		return
	}
	if !Updating() {
		t.Fatalf("%s: the generated region %q differs from what the code says; run:\n\n\t%s\n\nfirst difference:\n%s",
			path, name, regen, firstDifference(doc[from:to], region))
	}
	doc = doc[:from] + region + doc[to:]
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrote the generated region %q of %s", name, path)
}

// firstDifference returns the first line where got and want differ, both
// versions.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for n := 0; n < len(g) || n < len(w); n++ {
		var gl, wl string
		if n < len(g) {
			gl = g[n]
		}
		if n < len(w) {
			wl = w[n]
		}
		if gl != wl {
			return fmt.Sprintf("line %d of the region\n  document: %s\n  code:     %s", n+1, gl, wl)
		}
	}
	return ""
}
