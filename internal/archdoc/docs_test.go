package archdoc

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// documents are the Markdown files of the repository that the tests read
// (relative to the module root).
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// migrationVersions returns the versions of migrations/*.sql, in order:
// "00001", "00002", ...
func migrationVersions(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "migrations", "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		v, _, ok := strings.Cut(filepath.Base(f), "_")
		if !ok {
			t.Fatalf("migration %s is not named VERSION_name.sql", f)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	if len(out) == 0 {
		t.Fatal("no migrations in migrations/")
	}
	return out
}

// migrationRange matches a range of migration versions: 00001–00014.
var migrationRange = regexp.MustCompile(`\b(\d{5})\s*[–-]\s*(\d{5})\b`)

// TestMigrationRanges checks every range of migrations the documents and
// the Go files write ("00001–00014") against migrations/*.sql.
func TestMigrationRanges(t *testing.T) {
	versions := migrationVersions(t)
	want := versions[0] + "–" + versions[len(versions)-1]
	files := documents(t)
	gofiles, err := filepath.Glob(filepath.Join(root, "*", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gofiles {
		rel, _ := filepath.Rel(root, g)
		files = append(files, filepath.ToSlash(rel))
	}
	for _, f := range files {
		for i, line := range strings.Split(read(t, f), "\n") {
			for _, m := range migrationRange.FindAllStringSubmatch(line, -1) {
				if got := m[1] + "–" + m[2]; got != want {
					t.Errorf("%s:%d: the migrations are %s, not %s: %s", f, i+1, want, got, strings.TrimSpace(line))
				}
			}
		}
	}
}

// TestMigrationTable checks that docs/ARCHITECTURE.md §3 has one row per
// migration, in order.
func TestMigrationTable(t *testing.T) {
	versions := migrationVersions(t)
	row := regexp.MustCompile(`^\| (\d{5}) \|`)
	var rows []string
	for line := range strings.Lines(read(t, archPath)) {
		if m := row.FindStringSubmatch(line); m != nil {
			rows = append(rows, m[1])
		}
	}
	if !slices.Equal(rows, versions) {
		t.Errorf("%s §3 has rows for the migrations %v; migrations/ holds %v", archPath, rows, versions)
	}
}

// link matches a Markdown link's target: [text](target); refLink a
// reference-style link's definition: [name]: target.
var (
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	refLink = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^>\s]+)>?`)
)

// anchors returns the GitHub anchors of the headings of a Markdown text.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	count := map[string]int{}
	fence := false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		a := slug(strings.TrimLeft(line, "#"))
		if n := count[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		count[a]++
	}
	return out
}

// slug is GitHub's anchor of a heading: lower case, punctuation dropped,
// spaces turned into hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestLinks checks every relative link of README.md and docs/*.md, inline
// or reference-style: the file it names exists, and so does the heading
// its #anchor names.
func TestLinks(t *testing.T) {
	for _, doc := range documents(t) {
		text := read(t, doc)
		for i, line := range strings.Split(text, "\n") {
			for _, m := range append(link.FindAllStringSubmatch(line, -1), refLink.FindAllStringSubmatch(line, -1)...) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				linked := doc
				if file != "" {
					linked = filepath.ToSlash(filepath.Join(filepath.Dir(doc), file))
					if _, err := os.Stat(filepath.Join(root, linked)); err != nil {
						t.Errorf("%s:%d: the link %s names %s, which the repository does not hold", doc, i+1, target, linked)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(linked, ".md") {
					continue
				}
				if !anchors(read(t, linked))[anchor] {
					t.Errorf("%s:%d: the link %s names no heading of %s", doc, i+1, target, linked)
				}
			}
		}
	}
}
