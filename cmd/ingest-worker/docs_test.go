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

// settingRows returns the rows of the settings tables of a Markdown
// document (rows whose first cell is `INGEST_…`), by variable.
func settingRows(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "| `INGEST_")
		if !ok {
			continue
		}
		env, _, _ := strings.Cut(rest, "`")
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if _, dup := rows["INGEST_"+env]; dup {
			t.Errorf("%s has two rows of INGEST_%s", path, env)
		}
		rows["INGEST_"+env] = cells
	}
	return rows
}

// The settings tables of README.md and docs/ARCHITECTURE.md §5 name only
// settings the binary has, with their flags, and ARCHITECTURE.md marks
// exactly the settings where an empty value is a value.
func TestDocsNameOnlySettings(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"../../README.md", "../../docs/ARCHITECTURE.md"} {
		for env, cells := range settingRows(t, path) {
			s := settingOf(env)
			if s.set == nil {
				t.Errorf("%s has a row of %s, which is no setting of cmd/ingest-worker/config.go", path, env)
				continue
			}
			if len(cells) < 3 || cells[1] != "`--"+s.flagName()+"`" {
				t.Errorf("%s: the row of %s does not give its flag --%s second: %v", path, env, s.flagName(), cells)
				continue
			}
			if path == "../../docs/ARCHITECTURE.md" && strings.Contains(cells[2], "allowed") != s.emptyMeansEmpty {
				t.Errorf("%s: the default of %s says %q; an empty value is a value: %v (mark it \"empty allowed\" exactly then)", path, env, cells[2], s.emptyMeansEmpty)
			}
		}
	}
}
