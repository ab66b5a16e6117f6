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
	browserReady := browser(t, 55*time.Second)
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

	run("tasks", chromedp.Navigate(u+"tasks"), chromedp.WaitVisible(chromedp.CSS("table.tasks")), shot.take("tasks"),
		chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "DEAD"),
		chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)),
		at("status=DEAD"),
		chromedp.WaitVisible(chromedp.CSS(`a[href="/ui/tasks/`+dead+`"]`)))

	// Cancel the delayed task.
	run("cancel", chromedp.Navigate(u+"tasks/"+later.Task.ID.String()), chromedp.WaitVisible(chromedp.CSS("#cancel")),
		chromedp.SendKeys(chromedp.CSS(`input[name="reason"]`), "not needed any more"),
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

	// A phone.
	run("phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateScale(2)),
		chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS("#live .tiles")), shot.take("overview-phone"),
		chromedp.Navigate(u+"tasks/"+dead), chromedp.WaitVisible(chromedp.CSS("#live")), shot.take("task-phone"))
	run("phone layout", chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS("#live .tiles")))
	if overflow, err := chromedp.Run(b, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`)); err != nil || overflow {
		t.Fatal("the overview is wider than a phone's screen")
	}
}
