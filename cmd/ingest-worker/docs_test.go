package main

import (
	"os"
	"strings"
	"testing"
)

// The configuration table of README.md lists every setting with
// its flag and default.
func TestDocsListEverySetting(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, s := range settings {
		row := "| `" + s.env + "` | `--" + s.flagName() + "` | "
		i := strings.Index(doc, row)
		if i < 0 {
			t.Errorf("README.md has no row %q", row)
			continue
		}
		line, _, _ := strings.Cut(doc[i+len(row):], "\n")
		if s.def != "" && !strings.HasPrefix(line, "`"+s.def+"`") {
			t.Errorf("%s: the documented default is not %q: %s", s.env, s.def, line)
		}
	}
}
