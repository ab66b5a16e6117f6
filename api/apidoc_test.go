package api_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/testenv"
)

// The route table of docs/API.md lies between these lines and is written
// from the document by routeTable.
const (
	routesBegin = "<!-- The route table below is generated from api/openapi.json: INGEST_UPDATE_DOCS=1 go test ./api -run TestAPIDocRoutes rewrites it. -->"
	routesEnd   = "<!-- End of the generated route table. -->"
)

// docOperation is what the route table shows of an operation.
type docOperation struct {
	Description string `json:"description"`
	Responses   map[string]struct {
		Content map[string]struct {
			Schema struct {
				Ref   string `json:"$ref"`
				Type  any    `json:"type"`
				Items struct {
					Ref string `json:"$ref"`
				} `json:"items"`
			} `json:"schema"`
		} `json:"content"`
	} `json:"responses"`
}

// routeTable renders the document's operations as a Markdown table: the
// route, what it does, and its answers (a success with its schema, then
// the error codes).
func routeTable(t *testing.T) string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	paths := make([]string, 0, len(doc.Paths))
	for p := range doc.Paths {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var b strings.Builder
	b.WriteString("| route | answer | status codes |\n|---|---|---|\n")
	for _, path := range paths {
		for _, method := range httpMethods {
			raw, ok := doc.Paths[path][method]
			if !ok {
				continue
			}
			var op docOperation
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			codes := make([]string, 0, len(op.Responses))
			for code := range op.Responses {
				codes = append(codes, code)
			}
			slices.Sort(codes)
			var answers []string
			for _, code := range codes {
				if code[0] >= '4' {
					answers = append(answers, code)
					continue
				}
				schema := ""
				for _, c := range op.Responses[code].Content {
					switch {
					case c.Schema.Ref != "":
						schema = " `" + filepath.Base(c.Schema.Ref) + "`"
					case c.Schema.Items.Ref != "":
						schema = " `[" + filepath.Base(c.Schema.Items.Ref) + "]`"
					}
				}
				answers = append(answers, code+schema)
			}
			desc := strings.ReplaceAll(strings.ReplaceAll(op.Description, "|", `\|`), "\n", " ")
			fmt.Fprintf(&b, "| `%s %s` | %s | %s |\n", strings.ToUpper(method), path, desc, strings.Join(answers, ", "))
		}
	}
	return b.String()
}

// TestAPIDocRoutes: the route table of docs/API.md is the document's,
// written by routeTable; with INGEST_UPDATE_DOCS=1 the test rewrites it.
func TestAPIDocRoutes(t *testing.T) {
	t.Parallel()
	file := filepath.Join(testenv.Root(t), "docs", "API.md")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	before, rest, ok1 := strings.Cut(text, routesBegin+"\n")
	current, after, ok2 := strings.Cut(rest, routesEnd)
	if !ok1 || !ok2 {
		t.Fatalf("docs/API.md lacks the lines that enclose the route table:\n%s\n%s", routesBegin, routesEnd)
	}
	want := "\n" + routeTable(t) + "\n"
	if current == want {
		return
	}
	if os.Getenv("INGEST_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(file, []byte(before+routesBegin+"\n"+want+routesEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("docs/API.md: route table rewritten from api/openapi.json")
		return
	}
	t.Fatal("docs/API.md's route table differs from api/openapi.json: run INGEST_UPDATE_DOCS=1 go test ./api -run TestAPIDocRoutes")
}
