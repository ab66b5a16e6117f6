package archdoc

import (
	"errors"
	"flag"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the documents in place (or set INGEST_UPDATE_DOCS=1)")

// updating reports whether the test rewrites the documents instead of
// failing on a difference.
func updating() bool { return *update || Updating() }

// root is the module's directory, two levels above this package.
const root = "../.."

// modulePath reads the module path from go.mod.
func modulePath(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.TrimSpace(p)
		}
	}
	t.Fatal("go.mod has no module line")
	return ""
}

// pkg is a package of the module as the table names it.
type pkg struct {
	name     string   // "ingest" for the root, else its directory: "task", "internal/clip"
	imports  []string // module packages its non-test files import, named the same way
	synopsis string   // the first sentence of its package documentation
}

// modulePackages returns every package of the module (nested modules,
// testdata and hidden directories excluded) with its imports of module
// packages from its non-test files, for the default build context: what
// 'go list ./...' lists.
func modulePackages(t *testing.T) map[string]pkg {
	t.Helper()
	mod := modulePath(t)
	name := func(importPath string) (string, bool) {
		if importPath == mod {
			return "ingest", true
		}
		rel, ok := strings.CutPrefix(importPath, mod+"/")
		return rel, ok
	}
	out := map[string]pkg{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		base := d.Name()
		if path != root {
			if strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own (bench/river)
			}
		}
		p, err := build.Default.ImportDir(path, 0)
		if _, none := errors.AsType[*build.NoGoError](err); none {
			return nil
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		n := "ingest"
		if rel != "." {
			n = filepath.ToSlash(rel)
		}
		q := pkg{name: n, synopsis: p.Doc}
		for _, imp := range p.Imports {
			if m, ok := name(imp); ok {
				q.imports = append(q.imports, m)
			}
		}
		out[n] = q
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// importCell is the import column of p: the root package first, then the
// others in order, or — for none.
func importCell(p pkg) string {
	if len(p.imports) == 0 {
		return "—"
	}
	imps := slices.Clone(p.imports)
	slices.SortFunc(imps, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == "ingest":
			return -1
		case b == "ingest":
			return 1
		}
		return strings.Compare(a, b)
	})
	cells := make([]string, len(imps))
	for i, m := range imps {
		cells[i] = "`" + m + "`"
	}
	return strings.Join(cells, ", ")
}

// packageCell is the first column of a new row.
func packageCell(name string) string {
	if name == "ingest" {
		return "`ingest` (root)"
	}
	return "`" + name + "`"
}

// tableRow is a row of the packages table: its package, its owns column
// (kept as it is) and its import column.
type tableRow struct {
	name, first, owns, imports string
}

func (r tableRow) String() string {
	return "| " + r.first + " | " + r.owns + " | " + r.imports + " |"
}

// parseRow splits a table row "| `pkg/` | owns | imports |". The owns
// column may hold anything but " | ".
func parseRow(line string) (tableRow, bool) {
	if !strings.HasPrefix(line, "| `") || !strings.HasSuffix(line, " |") {
		return tableRow{}, false
	}
	body := strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |")
	first, rest, ok1 := strings.Cut(body, " | ")
	i := strings.LastIndex(rest, " | ")
	if !ok1 || i < 0 {
		return tableRow{}, false
	}
	name := strings.TrimSuffix(strings.SplitN(first, "`", 3)[1], "/")
	return tableRow{name: name, first: first, owns: rest[:i], imports: rest[i+len(" | "):]}, true
}

const (
	archPath        = "docs/ARCHITECTURE.md"
	packagesHeading = "## 8. Packages"
)

// section returns the lines of doc from the heading line to the next
// heading of the same level (exclusive), and where they start and end.
func section(t *testing.T, lines []string, heading string) (from, to int) {
	t.Helper()
	from = slices.Index(lines, heading)
	if from < 0 {
		t.Fatalf("%s has no heading %q", archPath, heading)
	}
	level := strings.SplitN(heading, " ", 2)[0] + " "
	for to = from + 1; to < len(lines) && !strings.HasPrefix(lines[to], level); to++ {
	}
	return from, to
}

// TestPackagesTable checks the table of docs/ARCHITECTURE.md §8 against
// the module: one row per package, and each row's import column is the
// module packages the package's non-test files import.
func TestPackagesTable(t *testing.T) {
	pkgs := modulePackages(t)
	b, err := os.ReadFile(filepath.Join(root, archPath))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	from, to := section(t, lines, packagesHeading)

	var out []string // the section as it should be
	seen := map[string]bool{}
	lastRow := -1
	var wrong []string
	for _, line := range lines[from:to] {
		r, ok := parseRow(line)
		if !ok {
			out = append(out, line)
			continue
		}
		p, exists := pkgs[r.name]
		switch {
		case !exists:
			wrong = append(wrong, "remove the row of "+r.name+", which is no package of the module:\n"+line)
			continue
		case seen[r.name]:
			wrong = append(wrong, "remove the second row of "+r.name+":\n"+line)
			continue
		}
		seen[r.name] = true
		if want := importCell(p); r.imports != want {
			r.imports = want
			wrong = append(wrong, "the imports of "+r.name+" are:\n"+r.String())
		}
		out = append(out, r.String())
		lastRow = len(out) - 1
	}
	if lastRow < 0 {
		t.Fatalf("%s §8 has no package table", archPath)
	}
	var missing []string
	for name := range pkgs {
		if !seen[name] {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	var added []string
	for _, name := range missing {
		p := pkgs[name]
		owns := strings.TrimPrefix(p.synopsis, "Package "+filepath.Base(name)+" ")
		owns = strings.TrimPrefix(owns, "owns ")
		r := tableRow{name: name, first: packageCell(name), owns: strings.TrimSuffix(owns, "."), imports: importCell(p)}
		added = append(added, r.String())
		wrong = append(wrong, "add a row for "+name+" (what it owns from its package doc):\n"+r.String())
	}
	out = slices.Insert(out, lastRow+1, added...)
	if len(wrong) == 0 {
		return
	}
	if !updating() {
		t.Fatalf("%s §8 does not match the module's packages (rerun with INGEST_UPDATE_DOCS=1 to rewrite it):\n\n%s",
			archPath, strings.Join(wrong, "\n\n"))
	}
	lines = slices.Replace(lines, from, to, out...)
	if err := os.WriteFile(filepath.Join(root, archPath), []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrote %s §8:\n%s", archPath, strings.Join(wrong, "\n\n"))
}
