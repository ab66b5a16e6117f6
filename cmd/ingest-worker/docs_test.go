package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ingest-worker/ingest/internal/archdoc"
	"github.com/ingest-worker/ingest/internal/redact"
)

// regenerate is the command that rewrites the generated references.
const regenerate = archdoc.UpdateEnv + "=1 go test -run TestGeneratedReferences ./cmd/ingest-worker"

// The configuration reference (docs/CONFIGURATION.md) and the CLI
// reference (docs/CLI.md) are generated from the settings table and the
// command tree; the test fails when a document no longer says what the
// code says, and rewrites them with archdoc.UpdateEnv=1.
func TestGeneratedReferences(t *testing.T) {
	archdoc.CheckGenerated(t, "../../docs/CONFIGURATION.md", "settings", configReference(t), regenerate)
	archdoc.CheckGenerated(t, "../../docs/CLI.md", "commands", cliReference(), regenerate)
}

// mdText escapes plain text (a usage string, a command's help) for
// Markdown: nothing in it is markup.
func mdText(s string) string {
	return strings.NewReplacer(`\`, `\\`, "*", `\*`, "<", `\<`, ">", `\>`,
		"[", `\[`, "]", `\]`, "`", "\\`", "|", `\|`).Replace(s)
}

// mdCell makes Markdown fit a table cell.
func mdCell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// configReference is the settings part of docs/CONFIGURATION.md: a table
// per group of settingGroups, each row a setting with its flag, default,
// the commands that use it and its description.
func configReference(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	workers := make([]string, 0, len(workerCommands))
	for c := range workerCommands {
		workers = append(workers, "`"+c+"`")
	}
	slices.Sort(workers)
	fmt.Fprintf(&b, "The column *used by* says which commands an invalid value stops:\n\n"+
		"- *every command*: a global setting, a flag of every command;\n"+
		"- *workers*: a worker setting, a flag of `run`, `demo` and `config`; it stops\n"+
		"  %s and the commands named after it, while any other\n"+
		"  command warns and uses the default.\n\n"+
		"Secrets are masked wherever a value is shown.\n", strings.Join(workers, ", "))
	g := -1
	for _, s := range settings {
		if g+1 < len(settingGroups) && settingGroups[g+1].first == s.env {
			g++
			fmt.Fprintf(&b, "\n### %s\n\n| variable | flag | default | used by | meaning |\n|---|---|---|---|---|\n", settingGroups[g].title)
		}
		if g < 0 {
			t.Fatalf("settingGroups does not start with the first setting, %s", s.env)
		}
		def := "(empty)"
		if s.def != "" {
			def = "`" + s.def + "`"
		}
		if s.emptyMeansEmpty && s.def != "" {
			def += " (may be set empty)"
		}
		used := "every command"
		if s.scope == scopeWorker {
			used = "workers"
			for _, c := range s.alsoFor {
				used += ", `" + c + "`"
			}
		}
		meaning := mdText(s.usage)
		if s.long != "" {
			meaning = mdCell(s.long)
		}
		if s.secret {
			meaning += " (secret: masked)"
		}
		fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s | %s |\n", s.env, s.flagName(), mdCell(def), used, meaning)
	}
	if g != len(settingGroups)-1 {
		t.Fatalf("settingGroups names a first setting out of order: %s", settingGroups[g+1].first)
	}
	return b.String()
}

// cliReference is the commands part of docs/CLI.md: the command tree of
// the binary by help group, each command with its help, usage, examples
// and its own flags.
func cliReference() string {
	root := (&app{scrub: redact.NewScrubber()}).rootCommand()
	var b strings.Builder
	fmt.Fprintf(&b, "## `%s`\n\n", root.CommandPath())
	writeCommand(&b, root)
	for _, g := range root.Groups() {
		fmt.Fprintf(&b, "\n## %s\n", strings.TrimSuffix(g.Title, ":"))
		for _, c := range root.Commands() {
			if c.GroupID == g.ID {
				walkCommands(&b, c)
			}
		}
	}
	return b.String()
}

// walkCommands writes c and its subcommands.
func walkCommands(b *strings.Builder, c *cobra.Command) {
	if c.Hidden || c.Name() == "help" {
		return
	}
	fmt.Fprintf(b, "\n### `%s`\n\n", c.CommandPath())
	writeCommand(b, c)
	for _, sub := range c.Commands() {
		walkCommands(b, sub)
	}
}

// writeCommand writes one command's help: its description, usage,
// examples and flags (a setting's flag is named, its meaning is in the
// configuration reference).
func writeCommand(b *strings.Builder, c *cobra.Command) {
	long := c.Long
	if long == "" {
		long = c.Short
	}
	b.WriteString(helpMarkdown(long))
	fmt.Fprintf(b, "\n```text\n%s\n```\n", c.UseLine())
	if c.HasAvailableSubCommands() {
		var subs []string
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				subs = append(subs, "[`"+sub.Name()+"`](#"+anchor(sub.CommandPath())+")")
			}
		}
		fmt.Fprintf(b, "\nCommands: %s.\n", strings.Join(subs, ", "))
	}
	if c.Example != "" {
		fmt.Fprintf(b, "\nExamples:\n\n```sh\n%s\n```\n", dedent(strings.Split(strings.TrimRight(c.Example, "\n"), "\n")))
	}
	var rows []string
	settingsOf := map[scope]int{} // the command's setting flags by scope
	c.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" || f.Hidden {
			return
		}
		if _, ok := f.Value.(*settingValue); ok {
			settingsOf[settingFlagNamed(f.Name).scope]++
			return
		}
		name := "`--" + f.Name
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		typ, usage := pflag.UnquoteUsage(f)
		if typ != "" {
			name += " " + typ
		}
		name += "`"
		def := ""
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" && f.DefValue != "0" {
			def = "`" + f.DefValue + "`"
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", name, mdText(usage), mdCell(def)))
	})
	if len(rows) > 0 {
		fmt.Fprintf(b, "\n| flag | meaning | default |\n|---|---|---|\n%s\n", strings.Join(rows, "\n"))
	}
	for _, sc := range []scope{scopeGlobal, scopeWorker} {
		n := settingsOf[sc]
		if n == 0 {
			continue
		}
		what := map[scope]string{scopeGlobal: "global settings", scopeWorker: "worker settings"}[sc]
		if all := len(slices.DeleteFunc(slices.Clone(settings), func(s setting) bool { return s.scope != sc })); n < all {
			what = fmt.Sprintf("%s (%d of the %d)", what, n, all)
		}
		fmt.Fprintf(b, "\nThe flags of the %s, each with its variable and meaning in the\n"+
			"[configuration reference](CONFIGURATION.md).\n", what)
	}
}

// helpMarkdown turns a command's terminal help into Markdown: a paragraph
// per block of lines, indented lines (tables, command lines) as text
// blocks.
func helpMarkdown(help string) string {
	var b strings.Builder
	for _, block := range strings.Split(strings.TrimSpace(help), "\n\n") {
		lines := strings.Split(block, "\n")
		n := 0 // the block's leading lines that are not indented
		for n < len(lines) && !strings.HasPrefix(lines[n], " ") {
			n++
		}
		if n > 0 {
			b.WriteString("\n" + mdText(strings.Join(lines[:n], "\n")) + "\n")
		}
		if n < len(lines) {
			b.WriteString("\n```text\n" + dedent(lines[n:]) + "\n```\n")
		}
	}
	return strings.TrimPrefix(b.String(), "\n")
}

// dedent removes the indentation the lines share.
func dedent(lines []string) string {
	indent := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if n := len(l) - len(strings.TrimLeft(l, " ")); indent < 0 || n < indent {
			indent = n
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		if len(l) >= indent && indent > 0 {
			l = l[indent:]
		}
		out[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(out, "\n")
}

// settingFlagNamed returns the setting whose flag is name.
func settingFlagNamed(name string) setting {
	for _, s := range settings {
		if s.flagName() == name {
			return s
		}
	}
	panic("no setting has the flag --" + name)
}

// anchor is the Markdown anchor of the heading of a command path.
func anchor(path string) string { return strings.ReplaceAll(strings.ToLower(path), " ", "-") }

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

// The settings table of docs/ARCHITECTURE.md §5 names only settings the
// binary has, with their flags, and marks exactly the settings where an
// empty value is a value. (docs/CONFIGURATION.md is generated:
// TestGeneratedReferences.)
func TestDocsNameOnlySettings(t *testing.T) {
	t.Parallel()
	const path = "../../docs/ARCHITECTURE.md"
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
		if strings.Contains(cells[2], "allowed") != s.emptyMeansEmpty {
			t.Errorf("%s: the default of %s says %q; an empty value is a value: %v (mark it \"empty allowed\" exactly then)", path, env, cells[2], s.emptyMeansEmpty)
		}
	}
}

// The command table of docs/ARCHITECTURE.md §7.2 names only commands the
// binary has, and every command the binary has (docs/CLI.md is
// generated: TestGeneratedReferences).
func TestDocsCommandTable(t *testing.T) {
	t.Parallel()
	const path = "../../docs/ARCHITECTURE.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n### 7.2 ")
	if !ok {
		t.Fatalf("%s has no section 7.2", path)
	}
	section, _, _ = strings.Cut(section, "\n### ")
	root := (&app{scrub: redact.NewScrubber()}).rootCommand()
	documented := map[string]bool{}
	for line := range strings.Lines(section) {
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " | ")
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		// Each code span of the first cell starts with a command's path.
		spans := strings.Split(first, "`")
		for i := 1; i < len(spans); i += 2 {
			var words []string
			for _, w := range strings.Fields(spans[i]) {
				if strings.Trim(w, "abcdefghijklmnopqrstuvwxyz-") != "" || strings.HasPrefix(w, "-") {
					break
				}
				words = append(words, w)
			}
			c, rest, err := root.Find(words)
			if err != nil || len(rest) > 0 || c == root {
				t.Errorf("%s §7.2 names the command %q, which the binary does not have", path, strings.Join(words, " "))
				continue
			}
			documented[c.CommandPath()] = true
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			if sub.Runnable() && !documented[sub.CommandPath()] {
				t.Errorf("%s §7.2 has no row for %q", path, sub.CommandPath())
			}
			walk(sub)
		}
	}
	walk(root)
}
