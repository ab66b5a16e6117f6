package ui_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ingest-worker/ingest/ui"
)

// TestBrowserPipeline: in Chromium, a small pipeline's join shows its
// graph (the document two levels up, the chunks one), its nodes and the
// workflow link lead to the right pages, the graph survives the page's
// live reload, and a hostile kind and error show as text: their markup
// neither renders nor runs.
func TestBrowserPipeline(t *testing.T) {
	t.Parallel()
	shot := newShots(t)
	browserReady := browser(t, 120*time.Second)
	b := setup(t, options{})
	const evil = `<img src=x onerror="window.__pwned=1">`
	p := b.newPipeline(t, 3, "chunk"+evil)
	b.kill(t, p.chunks[2].ID, "embed failed: "+evil)
	u := b.srv.URL + ui.Prefix
	ctx := browserReady()

	// check evaluates a JavaScript condition and fails with what when it
	// does not hold.
	check := func(js, what string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			ok, err := chromedp.Evaluate[bool](js)(ctx, t)
			if err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if !ok {
				return fmt.Errorf("%s: %s is false", what, js)
			}
			return nil
		})
	}
	// at waits until the page's address contains substr and it loaded.
	at := func(substr string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			for {
				ok, err := chromedp.Evaluate[bool](fmt.Sprintf(`location.href.includes(%q) && document.readyState === "complete"`, substr))(ctx, t)
				if err == nil && ok {
					return nil
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("waiting for %s: %w", substr, ctx.Err())
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
	// reloaded waits for the live part's next swap.
	reloaded := chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		if _, err := chromedp.Evaluate[bool](`(window.__swaps = 0, document.body.addEventListener("htmx:afterSwap", () => window.__swaps++), true)`)(ctx, t); err != nil {
			return err
		}
		for {
			n, err := chromedp.Evaluate[int](`window.__swaps`)(ctx, t)
			if err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for the live reload: %w", ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	safe := check(`window.__pwned === undefined && document.querySelectorAll("main img").length === 0`, "no markup of data renders")

	join, doc := p.join.ID.String(), p.doc.ID.String()
	run("the join's graph", chromedp.Navigate(u+"tasks/"+join), chromedp.WaitVisible(chromedp.CSS("#graph")),
		check(`document.querySelectorAll("#graph .node").length === 5`, "five tasks in the graph"),
		check(`[...document.querySelectorAll("#graph h4")].map(h => h.textContent).join() === "2 levels up,dependencies,this task"`, "the columns"),
		check(fmt.Sprintf(`[...document.querySelectorAll("#graph .node .kind")].some(k => k.textContent === %q)`, "chunk"+evil), "the hostile kind as text"),
		check(`document.querySelector("#graph .node.self").getAttribute("href").endsWith(`+fmt.Sprintf("%q", join)+`)`, "the task itself marked"),
		check(`document.querySelectorAll("#edges tbody tr").length === 6`, "six edges"),
		safe, reloaded, chromedp.WaitVisible(chromedp.CSS("#graph")),
		check(`document.querySelectorAll("#graph .node").length === 5`, "the graph after a live reload"), safe)

	run("a node leads to its task", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#graph a.node[data-id=%q]`, doc))), at("/ui/tasks/"+doc),
		chromedp.WaitVisible(chromedp.CSS("#graph")),
		check(fmt.Sprintf(`document.querySelector("#graph .node.self").dataset.id === %q`, doc), "the document's page"),
		check(`[...document.querySelectorAll("#graph h4")].map(h => h.textContent).join() === "this task,dependents,2 levels down"`, "the document's columns"))

	run("the workflow link lists the pipeline", chromedp.Click(chromedp.CSS("#workflow")), at("workflow="+doc),
		chromedp.WaitVisible(chromedp.CSS("table.tasks")),
		check(`document.querySelectorAll("table.tasks tbody tr").length === 5`, "the workflow's five tasks"),
		check(fmt.Sprintf(`document.querySelector("#workflow-filter").value === %q`, doc), "the filter shows the workflow"), safe)

	run("the failed chunk", chromedp.Navigate(u+"tasks/"+p.chunks[2].ID.String()), chromedp.WaitVisible(chromedp.CSS("#last-error")),
		check(fmt.Sprintf(`document.querySelector("#last-error").textContent.includes(%q)`, evil), "the hostile error as text"), safe)

	// The guide's picture: a plain pipeline's join.
	clean := b.newPipeline(t, 4, "doc.embed")
	run("screenshot", chromedp.Navigate(u+"tasks/"+clean.join.ID.String()), chromedp.WaitVisible(chromedp.CSS("#graph")), shot.take("task-graph"))
}
