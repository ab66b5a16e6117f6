package ui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/reclaim"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/ui"
)

// chromium returns the Chromium binary: INGEST_TEST_CHROMIUM, or one on
// the PATH. A missing browser fails the test: it is a dependency of the
// tests like PostgreSQL and redis-server.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("INGEST_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the browser tests need Chromium and none was found: install it (Debian: apt-get install chromium) " +
		"or set INGEST_TEST_CHROMIUM to a Chromium or Chrome binary")
	return ""
}

// browser starts a headless Chromium with a fresh profile, in the
// background; the function it returns waits for it. The flags keep it off
// the network (it would wait on connections on a machine without one).
func browser(t *testing.T, timeout time.Duration) func() context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	ctx, cancel := context.WithTimeout(bctx, timeout)
	t.Cleanup(func() { cancel(); cancelBrowser(); cancelAlloc() })
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }() // it starts while the caller prepares
	return func() context.Context {
		t.Helper()
		if err := <-started; err != nil {
			t.Fatalf("start Chromium: %v", err)
		}
		return ctx
	}
}

// shots saves screenshots into docs/screenshots when INGEST_UI_SCREENSHOTS=1
// (the committed ones; CI runs the test without writing them).
type shots struct {
	t   *testing.T
	dir string
}

func newShots(t *testing.T) *shots {
	if os.Getenv("INGEST_UI_SCREENSHOTS") != "1" {
		return &shots{t: t}
	}
	dir, err := filepath.Abs("../docs/screenshots")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &shots{t: t, dir: dir}
}

// take captures the page; it always renders (so the test covers it) and
// writes the PNG only when enabled.
func (s *shots) take(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		png, err := chromedp.FullScreenshot(100)(ctx, t)
		if err != nil {
			return fmt.Errorf("screenshot %s: %w", name, err)
		}
		if len(png) < 1000 {
			return fmt.Errorf("screenshot %s: %d bytes", name, len(png))
		}
		if s.dir == "" {
			return nil
		}
		return os.WriteFile(filepath.Join(s.dir, name+".png"), png, 0o644)
	})
}

// seedHistory adds n SUCCEEDED tasks (and a few DEAD ones) with their
// audit rows, created over the last 14 minutes, so that the charts have a
// history (the same shape a running worker leaves).
func seedHistory(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
WITH t AS (
    INSERT INTO ingest_task (id, kind, payload, payload_sha, status, attempt_count, created_at, updated_at, finished_at, last_error)
    SELECT gen_random_uuid(), (ARRAY['email', 'image.resize', 'embed'])[1 + i % 3], jsonb_build_object('n', i), md5(i::text),
           CASE WHEN i % 23 = 0 THEN 'DEAD' ELSE 'SUCCEEDED' END, CASE WHEN i % 23 = 0 THEN 1 ELSE 0 END,
           c, c + d, c + d, CASE WHEN i % 23 = 0 THEN 'upstream 503: model overloaded' END
    FROM (SELECT i, now() - (i::float8 / $1 * 840 + 20) * interval '1 second' AS c,
                 (0.2 + (i % 7) * 0.15 + (i % 61) * 0.02) * interval '1 second' AS d
          FROM generate_series(1, $1) AS i) s
    RETURNING id, status, created_at, finished_at
)
INSERT INTO ingest_task_transition (task_id, from_status, to_status, attempt_count, worker, message, created_at)
SELECT id, NULL, 'QUEUED', 0, 'api', 'created', created_at FROM t
UNION ALL SELECT id, 'QUEUED', 'RUNNING', 0, 'worker-1', NULL, created_at + (finished_at - created_at) / 2 FROM t
UNION ALL SELECT id, 'RUNNING', status, CASE WHEN status = 'DEAD' THEN 1 ELSE 0 END, 'worker-1',
                 CASE WHEN status = 'DEAD' THEN 'upstream 503: model overloaded' END, finished_at FROM t`, n)
	if err != nil {
		t.Fatalf("seed history: %v", err)
	}
}

func TestBrowser(t *testing.T) {
	t.Parallel()
	const token = "browser-test-token"
	shot := newShots(t)
	started := time.Now()
	browserReady := browser(t, 180*time.Second)
	ctx := context.Background()
	db := testenv.NewDatabase(t)
	rdb := testenv.Redis(t)
	stream, dlqKey := testenv.Keys(t)
	seedHistory(t, db.Pool, 900)

	// A real worker runs the tasks: emails succeed, image resizes fail
	// once, embeds die (into the DLQ).
	cfg := ingest.Config{
		Store:  task.Config{Stream: stream, Backoff: task.Backoff{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: 0.1}},
		Stream: stream, DLQ: dlqKey, Consumer: "worker-1", Concurrency: 8,
		TaskLease: 3 * time.Second, ReclaimIdle: 2 * time.Second, Block: 100 * time.Millisecond, ShutdownTimeout: 2 * time.Second,
		Reclaim: reclaim.Config{Interval: 200 * time.Millisecond},
		Relay: outbox.RelayConfig{PublishInterval: 100 * time.Millisecond,
			Backoff: backoff.Policy{Base: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: 0.1}},
		Maintenance: maintenance.Config{Rescuer: maintenance.RescuerConfig{Interval: time.Second, Grace: 2 * time.Second}},
	}
	svc, err := ingest.NewService(cfg, db.Pool, ingest.Redis(rdb), slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	svc.Handle("email", func(ctx context.Context, _ ingest.Task) error { time.Sleep(5 * time.Millisecond); return nil })
	svc.Handle("image.resize", func(ctx context.Context, tk ingest.Task) error {
		if tk.Attempt == 1 {
			return errors.New("thumbnailer: connection reset")
		}
		return nil
	})
	svc.Handle("embed", func(ctx context.Context, _ ingest.Task) error {
		return ingest.Permanent(errors.New("upstream 503: model overloaded"))
	})
	for _, kind := range []string{"bulk.desktop", "bulk.phone"} { // the bulk actions' tasks
		svc.Handle(kind, func(ctx context.Context, _ ingest.Task) error { return nil })
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	})
	store := svc.Store()
	var nts []task.NewTask
	for i := range 40 {
		kind := []string{"email", "email", "image.resize", "embed"}[i%4]
		nts = append(nts, task.NewTask{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"doc":%d,"note":"<b>not bold</b>"}`, i)),
			IdempotencyKey: fmt.Sprintf("doc-%d", i), MaxAttempts: 3,
			Traceparent: fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e%04x-00f067aa0ba902b7-01", i)})
	}
	if _, err := store.CreateBatch(ctx, nts); err != nil {
		t.Fatal(err)
	}
	later, err := store.Create(ctx, task.NewTask{Kind: "email", Payload: json.RawMessage(`{"to":"later@example.com"}`), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.Eventually(t, 30*time.Second, "the worker finishes the tasks", func() bool {
		return count(`SELECT count(*) FROM ingest_task WHERE status IN ('QUEUED', 'RETRYING', 'RUNNING') AND id <> $1`, later.Task.ID) == 0
	})
	var dead string
	if err := db.Pool.QueryRow(ctx, `SELECT id::text FROM ingest_task WHERE status = 'DEAD' AND idempotency_key IS NOT NULL ORDER BY created_at LIMIT 1`).Scan(&dead); err != nil {
		t.Fatal(err)
	}

	scheds, err := maintenance.ParseSchedules("", []byte(`[{"kind":"report.nightly","cron":"0 3 * * *"},{"kind":"sync","every":"30s"}]`))
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.New(ui.Config{Store: store, DB: db.Pool, Redis: rdb, Stream: stream, Group: "ingest-workers", DLQKey: dlqKey,
		Token: token, Periodic: func(now time.Time) []maintenance.Slot { return maintenance.NextSlots(scheds, now) }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u := srv.URL + ui.Prefix

	b := browserReady()
	t.Logf("fixture ready and browser started after %s", time.Since(started).Round(time.Millisecond))
	flash := func(want string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if _, err := chromedp.WaitVisible(chromedp.CSS(".flash"))(ctx, t); err != nil {
				return err
			}
			text, err := chromedp.Text(chromedp.CSS(".flash"))(ctx, t)
			if err != nil {
				return err
			}
			if !strings.Contains(text, want) {
				return fmt.Errorf("flash %q, want %q", text, want)
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
	// keptAfterReload waits for the page's live part to reload itself
	// (htmx swaps it every 2 s) and checks that the boxes are still ticked.
	keptAfterReload := func(boxes ...string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			if _, err := chromedp.Evaluate[bool](`(window.__swaps = 0, document.body.addEventListener("htmx:afterSwap", () => window.__swaps++), true)`)(ctx, t); err != nil {
				return err
			}
			for {
				n, err := chromedp.Evaluate[int](`window.__swaps`)(ctx, t)
				if err != nil {
					return err
				}
				if n > 0 {
					break
				}
				select {
				case <-ctx.Done():
					return fmt.Errorf("waiting for the live reload: %w", ctx.Err())
				case <-time.After(50 * time.Millisecond):
				}
			}
			for _, box := range boxes {
				ok, err := chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q).checked`, box))(ctx, t)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("%s lost its tick when the list reloaded itself", box)
				}
			}
			return nil
		})
	}
	// refused checks that the browser refuses to submit the form (its
	// confirmation box, required, is not ticked).
	refused := func(form string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			ok, err := chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q).checkValidity()`, form))(ctx, t)
			if err != nil {
				return err
			}
			if ok {
				return fmt.Errorf("the form %s can be submitted without its confirmation", form)
			}
			return nil
		})
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		begun := time.Now()
		if err := chromedp.Do(b, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %s", what, time.Since(begun).Round(time.Millisecond))
	}

	// The token is asked once.
	run("login", chromedp.Navigate(u),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		shot.take("login"),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("#live .tiles")))

	// The overview updates itself: a new kind appears without a reload.
	run("overview", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[bool](`(window.__noReload = true)`)(ctx, t)
		return err
	}), chromedp.Sleep(300*time.Millisecond), shot.take("overview"))
	if _, err := store.Create(ctx, task.NewTask{Kind: "report.nightly", Payload: json.RawMessage(`{}`), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	run("live overview", chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/tasks?kind=report.nightly"]`)))
	if same, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.__noReload === true`)); err != nil || !same {
		t.Fatal("the overview reloaded instead of updating in place")
	}

	run("tasks", chromedp.Navigate(u+"tasks"), chromedp.WaitVisible(chromedp.CSS("table.tasks")),
		chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "DEAD"),
		chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)),
		at("status=DEAD"),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/tasks/`+dead+`"]`)))

	// Cancel the delayed task: refused without the confirmation box, done
	// with it.
	run("cancel", chromedp.Navigate(u+"tasks/"+later.Task.ID.String()), chromedp.WaitVisible(chromedp.CSS("#cancel")),
		chromedp.SendKeys(chromedp.CSS(`input[name="reason"]`), "not needed any more"),
		refused(`form[action$="/cancel"]`),
		chromedp.Click(chromedp.CSS(`form[action$="/cancel"] input[name="confirm"]`)),
		chromedp.Click(chromedp.CSS("#cancel")), flash("Task cancelled."))
	if n := count(`SELECT count(*) FROM ingest_task WHERE id = $1 AND status = 'CANCELLED' AND cancel_requested_by = 'ui' AND cancel_reason = 'not needed any more'`, later.Task.ID); n != 1 {
		t.Fatal("the cancel did not reach the database")
	}

	// Delete the cancelled task: the confirmation box first.
	run("delete", chromedp.Navigate(u+"tasks/"+later.Task.ID.String()), chromedp.WaitVisible(chromedp.CSS("#delete")),
		chromedp.Click(chromedp.CSS(`form[action$="/delete"] input[name="confirm"]`)),
		chromedp.Click(chromedp.CSS("#delete")), flash("deleted with its history"))
	if n := count(`SELECT count(*) FROM ingest_task WHERE id = $1`, later.Task.ID); n != 0 {
		t.Fatal("the delete did not reach the database")
	}

	// A dead task's page, then its redrive.
	run("task", chromedp.Navigate(u+"tasks/"+dead), chromedp.WaitVisible(chromedp.CSS("#redrive")), shot.take("task"))
	run("redrive", chromedp.Click(chromedp.CSS("#redrive")), flash("Task redriven"))
	if n := count(`SELECT count(*) FROM ingest_task_transition WHERE task_id = $1 AND from_status = 'DEAD' AND to_status = 'QUEUED' AND worker = 'ui'`, dead); n != 1 {
		t.Fatalf("%d redrive transitions by ui", n)
	}

	// The DLQ: a dry run by filter, then the redrive it describes.
	run("dlq dry run", chromedp.Navigate(u+"dlq"), chromedp.WaitVisible(chromedp.CSS(`input[name="kind"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="kind"]`), "embed"),
		chromedp.SendKeys(chromedp.CSS(`input[name="error"]`), "upstream 503"),
		chromedp.Click(chromedp.CSS("#preview")),
		chromedp.WaitVisible(chromedp.CSS("#dryrun")),
		shot.take("dlq"))
	matched, err := chromedp.Run(b, chromedp.Text(chromedp.CSS("#dryrun strong")))
	if err != nil {
		t.Fatal(err)
	}
	before := count(`SELECT count(*) FROM ingest_task_transition WHERE to_status = 'QUEUED' AND worker = 'ui'`)
	run("bulk redrive", chromedp.Click(chromedp.CSS("#redrive-all")), flash("Matched "+matched+" tasks, redrove "+matched))
	if after := count(`SELECT count(*) FROM ingest_task_transition WHERE to_status = 'QUEUED' AND worker = 'ui'`); fmt.Sprint(after-before) != matched {
		t.Fatalf("the bulk redrive wrote %d redrive transitions, the dry run matched %s", after-before, matched)
	}

	// Pause a kind.
	run("pause", chromedp.Navigate(u+"kinds"), chromedp.WaitVisible(chromedp.CSS("#pause-email")),
		chromedp.Click(chromedp.CSS("#pause-email")), flash("Kind email paused"),
		chromedp.WaitVisible(chromedp.CSS("#resume-email")), shot.take("kinds"))
	if n := count(`SELECT count(*) FROM ingest_kind WHERE kind = 'email' AND paused AND updated_by = 'ui'`); n != 1 {
		t.Fatal("the pause did not reach the database")
	}

	// The task list's bulk actions and scheduled filter, on a desktop.
	bulkActions := func(kind string) {
		t.Helper()
		var ids []string
		for range 3 {
			c, err := store.Create(ctx, task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`), Delay: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, c.Task.ID.String())
		}
		list := u + "tasks?kind=" + kind
		rows := func(want int) chromedp.Action[chromedp.Void] {
			return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
				n, err := chromedp.Evaluate[int](`document.querySelectorAll("table.tasks tbody td.sel").length`)(ctx, t)
				if err == nil && n != want {
					err = fmt.Errorf("%d rows listed, want %d", n, want)
				}
				return err
			})
		}
		// The scheduled filter: its link, then the kind.
		run(kind+": scheduled filter", chromedp.Navigate(u+"tasks"), chromedp.WaitVisible(chromedp.CSS("#status-scheduled")),
			chromedp.Click(chromedp.CSS("#status-scheduled")), at("status=scheduled"),
			chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/tasks/`+ids[0]+`"]`)),
			chromedp.Navigate(u+"tasks?status=scheduled&kind="+kind), chromedp.WaitVisible(chromedp.CSS("table.tasks")), rows(3))
		// Cancel all of the page: refused without the box, then done.
		run(kind+": bulk cancel", chromedp.Navigate(list), chromedp.WaitVisible(chromedp.CSS("#select-all")),
			chromedp.Click(chromedp.CSS("#select-all")), at("select=all"), chromedp.WaitVisible(chromedp.CSS("#sel-"+ids[2])),
			refused("#bulk"),
			chromedp.Click(chromedp.CSS("#bulk-confirm")), chromedp.Click(chromedp.CSS("#bulk-cancel")), flash("3 tasks cancelled."))
		if n := count(`SELECT count(*) FROM ingest_task WHERE kind = $1 AND status = 'CANCELLED' AND cancel_requested_by = 'ui'`, kind); n != 3 {
			t.Fatalf("%s: %d tasks cancelled, want 3", kind, n)
		}
		// Redrive two, ticked one by one (the ticks survive the list's
		// live reload): they run and succeed.
		run(kind+": bulk redrive", chromedp.Navigate(list), chromedp.WaitVisible(chromedp.CSS("#sel-"+ids[0])),
			chromedp.Click(chromedp.CSS("#sel-"+ids[0])), chromedp.Click(chromedp.CSS("#sel-"+ids[1])),
			keptAfterReload("#sel-"+ids[0], "#sel-"+ids[1]),
			refused("#bulk"),
			chromedp.Click(chromedp.CSS("#bulk-confirm")), chromedp.Click(chromedp.CSS("#bulk-redrive")), flash("2 tasks redriven."))
		testenv.Eventually(t, 30*time.Second, "the redriven tasks succeed", func() bool {
			return count(`SELECT count(*) FROM ingest_task WHERE id = ANY($1::uuid[]) AND status = 'SUCCEEDED'`, ids[:2]) == 2
		})
		// Delete the page: the finished ones go, a waiting one is refused.
		if _, err := store.Create(ctx, task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`), Delay: time.Hour}); err != nil {
			t.Fatal(err)
		}
		run(kind+": bulk delete", chromedp.Navigate(list+"&select=all"), chromedp.WaitVisible(chromedp.CSS("#bulk-delete")), rows(4),
			refused("#bulk"),
			chromedp.Click(chromedp.CSS("#bulk-confirm")), chromedp.Click(chromedp.CSS("#bulk-delete")),
			flash("3 tasks deleted; 1 refused: still queued"))
		if n := count(`SELECT count(*) FROM ingest_task WHERE kind = $1`, kind); n != 1 {
			t.Fatalf("%s: %d tasks left after the bulk delete, want the waiting one", kind, n)
		}
	}
	bulkActions("bulk.desktop")
	run("tasks again", chromedp.Navigate(u+"tasks"), chromedp.WaitVisible(chromedp.CSS("table.tasks")), shot.take("tasks"))

	// A phone: every page fits its width; every control and column can
	// be scrolled into view.
	fits := func(page string, selectors string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			out, err := chromedp.Evaluate[[]string](fmt.Sprintf(`(() => {
				const bad = [];
				if (document.documentElement.scrollWidth > window.innerWidth) {
					bad.push("the page is " + document.documentElement.scrollWidth + "px wide, the screen " + window.innerWidth + "px");
				}
				const els = document.querySelectorAll(%q);
				if (els.length === 0) bad.push("nothing matches %s");
				for (const el of els) {
					el.scrollIntoView({block: "center", inline: "center"});
					const r = el.getBoundingClientRect();
					if (r.width === 0 || r.left < 0 || r.top < 0 || r.right > window.innerWidth || r.bottom > window.innerHeight) {
						bad.push((el.id || el.outerHTML.slice(0, 80)) + " at " + [r.left, r.top, r.right, r.bottom].map(Math.round).join(","));
					}
				}
				window.scrollTo(0, 0);
				return bad;
			})()`, selectors, selectors))(ctx, t)
			if err != nil {
				return err
			}
			if len(out) > 0 {
				return fmt.Errorf("%s on a phone: %d problems: %s", page, len(out), strings.Join(out, "; "))
			}
			return nil
		})
	}
	const controls = "main button, main input:not([type=hidden]), main select, main th, main .st"
	run("phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateScale(2)),
		chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS("#live .tiles")), shot.take("overview-phone"),
		fits("overview", "main a, main th"),
		chromedp.Navigate(u+"tasks"), chromedp.WaitVisible(chromedp.CSS("table.tasks")), shot.take("tasks-phone"),
		fits("tasks", controls+", #select-all, #select-none, .chips a"),
		chromedp.Navigate(u+"tasks/"+dead), chromedp.WaitVisible(chromedp.CSS("#live")), shot.take("task-phone"),
		fits("task (succeeded)", controls),
		chromedp.Navigate(u+"dlq"), chromedp.WaitVisible(chromedp.CSS("#preview")), fits("dlq", controls),
		chromedp.Navigate(u+"kinds"), chromedp.WaitVisible(chromedp.CSS("#resume-email")), fits("kinds", controls+", #pause-image\\.resize"))
	bulkActions("bulk.phone")
	waiting, err := store.Create(ctx, task.NewTask{Kind: "email", Payload: json.RawMessage(`{}`), Delay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	run("phone: task page", chromedp.Navigate(u+"tasks/"+waiting.Task.ID.String()), chromedp.WaitVisible(chromedp.CSS("#cancel")),
		fits("task (waiting)", controls), refused(`form[action$="/cancel"]`),
		chromedp.Click(chromedp.CSS(`form[action$="/cancel"] input[name="confirm"]`)),
		chromedp.Click(chromedp.CSS("#cancel")), flash("Task cancelled."))
}
