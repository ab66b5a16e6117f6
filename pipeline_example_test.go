package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// This file is the document-ingestion pipeline of docs/PIPELINES.md ("A
// document-ingestion pipeline, end to end"), run against real servers:
// the code between the markers is the guide's, word for word.

// The steps' results. Each step hands the next one where its output is,
// not the output itself (results stay small).
type (
	Fetched struct {
		Blob string `json:"blob"`
	}
	Parsed struct {
		Text string `json:"text"`
	}
	Split struct {
		Chunks int `json:"chunks"`
	}
	Embedded struct {
		Vector []float64 `json:"vector"`
	}
	Indexed struct {
		Vectors int `json:"vectors"`
	}
)

// Document is the payload of the pipeline's first steps.
type Document struct {
	URL   string `json:"url"`
	Email string `json:"email"`
}

// Chunk is the payload of an embed.
type Chunk struct {
	N    int    `json:"n"`
	Text string `json:"text"`
}

// docServices are the systems the handlers call: stand-ins here.
type docServices struct {
	mu      sync.Mutex
	blobs   map[string]string
	index   map[string][]float64
	notices []string
}

func (s *docServices) download(_ context.Context, url string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	blob := "blob://" + url
	s.blobs[blob] = "Annual report. Revenue grew. Costs fell. Outlook is good."
	return blob, nil
}

func (s *docServices) extractText(_ context.Context, blob string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blobs[blob], nil
}

func splitText(text string) []string {
	var out []string
	for _, s := range strings.Split(text, ".") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (s *docServices) embed(_ context.Context, text string) ([]float64, error) {
	return []float64{float64(len(text)), float64(strings.Count(text, " "))}, nil
}

func (s *docServices) upsert(_ context.Context, key string, vector []float64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.index[key] = vector
	return nil
}

func (s *docServices) sendMail(_ context.Context, to, msg string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notices = append(s.notices, to+": "+msg)
	return nil
}

// only decodes the one result of t's dependencies into v.
func only(t ingest.Task, v any) error {
	if len(t.Dependencies) != 1 {
		return ingest.Permanent(fmt.Errorf("want one dependency, have %d", len(t.Dependencies)))
	}
	for _, raw := range t.Dependencies {
		if err := json.Unmarshal(raw, v); err != nil {
			return ingest.Permanent(err)
		}
	}
	return nil
}

// --- the guide's code ---

// Upload starts a document's pipeline: its first three steps in one
// transaction, each waiting for the one before. The id it returns (of the
// fetch, the pipeline's root) is the workflow id of every task of the
// document, the three and those the split adds.
func Upload(ctx context.Context, store *task.Store, doc Document) (uuid.UUID, error) {
	payload, _ := json.Marshal(doc)
	res, err := store.CreateBatch(ctx, []task.NewTask{
		{Kind: "doc.fetch", Ref: "fetch", Payload: payload, IdempotencyKey: doc.URL},
		{Kind: "doc.parse", Ref: "parse", Payload: payload, IdempotencyKey: doc.URL, DependsOnRefs: []string{"fetch"}},
		{Kind: "doc.split", Payload: payload, IdempotencyKey: doc.URL, DependsOnRefs: []string{"parse"}},
	}) // the keys: a repeated upload finds the three, adds nothing
	if err != nil {
		return uuid.Nil, err
	}
	return res[0].Task.ID, nil
}

// RegisterPipeline registers the pipeline's handlers on svc.
func RegisterPipeline(svc *ingest.Service, ext *docServices) {
	store := svc.Store()
	svc.HandleResult("doc.fetch", ingest.Returning(func(ctx context.Context, t ingest.Task) (Fetched, error) {
		var doc Document
		if err := json.Unmarshal(t.Payload, &doc); err != nil {
			return Fetched{}, ingest.Permanent(err)
		}
		blob, err := ext.download(ctx, doc.URL)
		return Fetched{Blob: blob}, err
	}))
	svc.HandleResult("doc.parse", ingest.Returning(func(ctx context.Context, t ingest.Task) (Parsed, error) {
		var f Fetched
		if err := only(t, &f); err != nil { // the fetch's result
			return Parsed{}, err
		}
		text, err := ext.extractText(ctx, f.Blob)
		return Parsed{Text: text}, err
	}))
	// The split fans out: one embed per chunk, then an index after every
	// embed and a notice after the index. They wait for this split itself,
	// so none starts unless it succeeds; the idempotency keys make a
	// second run of the split (after a crash) find them instead of adding
	// more.
	svc.HandleResult("doc.split", ingest.Returning(func(ctx context.Context, t ingest.Task) (Split, error) {
		var p Parsed
		if err := only(t, &p); err != nil {
			return Split{}, err
		}
		var nts []task.NewTask
		var embeds []string
		for n, text := range splitText(p.Text) {
			ref := fmt.Sprintf("embed-%d", n)
			chunk, _ := json.Marshal(Chunk{N: n, Text: text})
			nts = append(nts, task.NewTask{Kind: "doc.embed", Ref: ref, Payload: chunk,
				DependsOn: []uuid.UUID{t.ID}, IdempotencyKey: fmt.Sprintf("%s/%d", t.ID, n)})
			embeds = append(embeds, ref)
		}
		nts = append(nts,
			task.NewTask{Kind: "doc.index", Ref: "index", Payload: t.Payload, DependsOnRefs: embeds,
				IdempotencyKey: t.ID.String()},
			// The notice runs whatever the index's end: it tells success
			// and failure alike.
			task.NewTask{Kind: "doc.notify", Payload: t.Payload, DependsOnRefs: []string{"index"},
				OnDependencyFailure: task.OnFailureRun, IdempotencyKey: t.ID.String()})
		if _, err := store.CreateBatch(ctx, nts); err != nil {
			return Split{}, err // retried; the keys keep it to one fan-out
		}
		return Split{Chunks: len(embeds)}, nil
	}))
	svc.HandleResult("doc.embed", ingest.Returning(func(ctx context.Context, t ingest.Task) (Embedded, error) {
		var c Chunk
		if err := json.Unmarshal(t.Payload, &c); err != nil {
			return Embedded{}, ingest.Permanent(err)
		}
		v, err := ext.embed(ctx, c.Text)
		return Embedded{Vector: v}, err
	}))
	svc.HandleResult("doc.index", ingest.Returning(func(ctx context.Context, t ingest.Task) (Indexed, error) {
		// t.Dependencies: every embed's result, keyed by its task id.
		for id, raw := range t.Dependencies {
			var e Embedded
			if err := json.Unmarshal(raw, &e); err != nil {
				return Indexed{}, ingest.Permanent(err)
			}
			if err := ext.upsert(ctx, id.String(), e.Vector); err != nil {
				return Indexed{}, err
			}
		}
		return Indexed{Vectors: len(t.Dependencies)}, nil
	}))
	svc.Handle("doc.notify", func(ctx context.Context, t ingest.Task) error {
		var doc Document
		if err := json.Unmarshal(t.Payload, &doc); err != nil {
			return ingest.Permanent(err)
		}
		msg := doc.URL + " could not be indexed" // the index ended DEAD or CANCELLED: no result
		var ix *Indexed
		if err := only(t, &ix); err == nil && ix != nil {
			msg = fmt.Sprintf("%s is indexed: %d chunks", doc.URL, ix.Vectors)
		}
		return ext.sendMail(ctx, doc.Email, msg)
	})
}

// --- end of the guide's code ---

// TestDocumentIngestionPipeline runs the guide's pipeline on a worker: an
// upload's fetch, parse and split, the split's fan-out of one embed per
// chunk, the index after all of them and the notice after it; every task
// of the document is in the upload's workflow, each ran after the tasks
// it depends on, and the notice tells the index's figure.
func TestDocumentIngestionPipeline(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	ext := &docServices{blobs: map[string]string{}, index: map[string][]float64{}}
	RegisterPipeline(svc, ext)
	ctx := context.Background()
	doc := Document{URL: "https://example.com/annual-report.pdf", Email: "ops@example.com"}
	workflow, err := Upload(ctx, b.store, doc)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Upload(ctx, b.store, doc)
	if err != nil || again != workflow {
		t.Fatalf("a second upload of the same document: %s, %v; want the first pipeline %s", again, err, workflow)
	}
	// The notice is the last task: wait for the workflow to hold it, then
	// for its end.
	var notify task.Task
	deadline := time.Now().Add(time.Minute)
	for notify.ID == uuid.Nil {
		ts, _, err := b.store.List(ctx, task.ListParams{Workflow: workflow, Kind: "doc.notify"})
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) == 1 {
			notify = ts[0]
		} else if time.Now().After(deadline) {
			t.Fatal("no doc.notify task in the workflow after a minute")
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if got, err := svc.Wait(wctx, notify.ID); err != nil || got.Status != task.Succeeded {
		t.Fatalf("doc.notify: %s (%s), %v; want SUCCEEDED", got.Status, got.LastError, err)
	}
	all, _, err := b.store.List(ctx, task.ListParams{Workflow: workflow, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, x := range all {
		kinds[x.Kind]++
		if x.Status != task.Succeeded {
			t.Errorf("%s %s is %s (%s)", x.Kind, x.ID, x.Status, x.LastError)
		}
	}
	if want := map[string]int{"doc.fetch": 1, "doc.parse": 1, "doc.split": 1, "doc.embed": 4, "doc.index": 1, "doc.notify": 1}; fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("the workflow holds %v, want %v", kinds, want)
	}
	// Every task started after each of its dependencies ended.
	var early int
	if err := b.db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM ingest_task_dependency d
		JOIN ingest_task_transition e ON e.task_id = d.depends_on AND e.to_status = 'SUCCEEDED'
		JOIN ingest_task_transition s ON s.task_id = d.task_id AND s.to_status = 'RUNNING'
		WHERE s.id < e.id`).Scan(&early); err != nil || early != 0 {
		t.Fatalf("%d runs began before a dependency had ended (%v)", early, err)
	}
	ext.mu.Lock()
	defer ext.mu.Unlock()
	if len(ext.index) != 4 || len(ext.notices) != 1 || ext.notices[0] != "ops@example.com: https://example.com/annual-report.pdf is indexed: 4 chunks" {
		t.Fatalf("index %v, notices %q", ext.index, ext.notices)
	}
}

// TestPipelineGuideIsThisCode: the guide's Go form is the code this file
// runs, word for word.
func TestPipelineGuideIsThisCode(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("pipeline_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	guide, err := os.ReadFile("docs/PIPELINES.md")
	if err != nil {
		t.Fatal(err)
	}
	_, code, _ := strings.Cut(string(src), "// --- the guide's code ---\n")
	code, _, _ = strings.Cut(code, "// --- end of the guide's code ---")
	if code = strings.Trim(code, "\n"); !strings.Contains(string(guide), "```go\n"+code+"\n```") {
		t.Fatal("docs/PIPELINES.md (A document-ingestion pipeline, end to end) does not hold the code between the markers of pipeline_example_test.go: copy it there")
	}
}
