package ui

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/httpguard"
	"github.com/ingest-worker/ingest/internal/opsmetrics"
	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// Prefix is the path the dashboard is served under.
const Prefix = "/ui/"

// Defaults and limits.
const (
	// SessionTTL is how long a login lasts.
	SessionTTL = 12 * time.Hour
	// DefaultActor is recorded as the worker of the dashboard's
	// transitions and kind changes.
	DefaultActor = "ui"
	// LiveInterval is how often a page's live part reloads itself.
	LiveInterval = 2 * time.Second
	// KindsInterval is how often the kinds page reloads its counts (a
	// GROUP BY over the task table, as GET /v1/kinds).
	KindsInterval = 10 * time.Second
)

const (
	sessionCookie = "ingest_ui_session"
	csrfCookie    = "ingest_ui_csrf"
	flashCookie   = "ingest_ui_flash"
	csrfField     = "csrf"
	// failedLoginDelay is how long a wrong token waits for its answer.
	failedLoginDelay = 300 * time.Millisecond
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config configures a Handler.
type Config struct {
	// Store reads and changes tasks; DB is the pool it runs on (the
	// dashboard's own read queries: overview counts, audit samples,
	// outbox rows, the leader).
	Store *task.Store
	DB    task.DB
	// Redis, Stream, Group and DLQKey name the task stream, its consumer
	// group and the DLQ stream; Redis nil (Kafka mode): no Redis view;
	// DLQKey "": no DLQ.
	Redis  redis.UniversalClient
	Stream string
	Group  string
	DLQKey string
	// Token, when set, is asked once on a login form (INGEST_API_TOKEN).
	Token string
	// ReadOnly hides every action and refuses action POSTs with 403
	// (INGEST_UI_READONLY).
	ReadOnly bool
	// Actor is recorded as the worker of cancels, redrives, run-nows and
	// kind changes, and logged with deletions and discards; default
	// DefaultActor.
	Actor string
	// MaxAttempts is the workers' limit of runs for tasks without their
	// own (shown on a task's page); 0: task.DefaultMaxAttempts.
	MaxAttempts int
	// Retention is the leader's retention windows of finished tasks, shown
	// on the overview (task.KeepForever: kept forever; all zero: not
	// shown, as for a dashboard that does not know them).
	Retention task.Windows
	// Periodic returns the next slot of each periodic schedule; nil: none.
	Periodic func(now time.Time) []maintenance.Slot
	// Logger receives failures; nil discards them.
	Logger *slog.Logger
	// Registerer, when set, receives the counter of deleted tasks
	// (ingest_task_deleted_total, via="ui").
	Registerer prometheus.Registerer
}

// Handler serves the dashboard under Prefix.
type Handler struct {
	cfg    Config
	mux    *http.ServeMux
	pages  map[string]*template.Template
	key    []byte   // HMAC key of session cookies, derived from the token
	routes []string // the mux's patterns (Routes)
	log    *slog.Logger
	stats  *overviewCache
	samp   *sampler
	// liveCap is how many unfinished tasks the overview counts in one
	// walk before it counts each state apart (3 × CountCap).
	liveCap int

	deleted prometheus.Counter // ingest_task_deleted_total{via="ui"}
}

// New returns the dashboard's handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Store == nil || cfg.DB == nil {
		return nil, errors.New("ui: a task store and its database are required")
	}
	cfg.Actor = cmp.Or(cfg.Actor, DefaultActor)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, task.DefaultMaxAttempts)
	if cfg.Redis == nil {
		cfg.DLQKey = ""
	}
	h := &Handler{cfg: cfg, log: cfg.Logger}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	mac := sha256.Sum256([]byte("ingest-worker ui session\x00" + cfg.Token))
	h.key = mac[:]
	h.stats = &overviewCache{}
	h.samp = newSampler(cfg.DB)
	h.liveCap = 3 * CountCap
	deleted, err := opsmetrics.Deleted(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("ui: register metrics: %w", err)
	}
	h.deleted = deleted.WithLabelValues("ui")
	if err := h.parseTemplates(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	routes := []struct {
		pattern string
		h       http.Handler
	}{
		{"GET /ui/static/", http.StripPrefix("/ui/static/", staticHandler(http.FileServerFS(static)))},
		{"GET /ui/login", http.HandlerFunc(h.loginPage)},
		{"POST /ui/login", http.HandlerFunc(h.login)},
		{"POST /ui/logout", http.HandlerFunc(h.logout)},
		{"GET /ui/{$}", h.page(h.overview)},
		{"GET /ui/tasks", h.page(h.tasks)},
		{"POST /ui/tasks/bulk", h.action(h.bulk)},
		{"GET /ui/tasks/{id}", h.page(h.taskPage)},
		{"POST /ui/tasks/{id}/cancel", h.action(h.cancel)},
		{"POST /ui/tasks/{id}/redrive", h.action(h.redrive)},
		{"POST /ui/tasks/{id}/delete", h.action(h.deleteTask)},
		{"POST /ui/tasks/{id}/run", h.action(h.runNow)},
		{"GET /ui/dlq", h.page(h.dlqPage)},
		{"POST /ui/dlq/redrive", h.action(h.bulkRedrive)},
		{"POST /ui/dlq/replay", h.action(h.replay)},
		{"POST /ui/dlq/discard", h.action(h.discard)},
		{"GET /ui/kinds", h.page(h.kinds)},
		{"POST /ui/kinds/{kind}", h.action(h.setKind)},
	}
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.Handle(rt.pattern, rt.h)
		h.routes = append(h.routes, rt.pattern)
	}
	mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		h.fail(w, r, http.StatusNotFound, "no such page")
	})
	h.mux = mux
	return h, nil
}

// Routes returns the pattern ("METHOD /path") of every route h serves
// (beside the catch-all "no such page").
func (h *Handler) Routes() []string { return slices.Clone(h.routes) }

// ServeHTTP implements http.Handler. A state-changing request that a
// browser sent on behalf of another site is refused with a 403 page before
// routing, the session and the CSRF token are looked at
// (httpguard.CrossSite).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	if cs := httpguard.CrossSite(r); cs != nil {
		h.fail(w, r, http.StatusForbidden, cs.Error())
		return
	}
	h.mux.ServeHTTP(w, r)
}

// staticHandler lets browsers cache the embedded assets for an hour.
func staticHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		next.ServeHTTP(w, r)
	})
}

// view is what every page template gets.
type view struct {
	Title    string
	Nav      string // the active menu entry
	CSRF     string
	ReadOnly bool
	Auth     bool // a token is configured: show the logout button
	Flash    *flash
	Live     string // the URL of the page's live part ("": none)
	Interval string // hx-trigger of the live part
	Now      time.Time
	D        any
}

type flash struct {
	Error bool
	Msg   string
}

// page wraps a GET handler: a session is required when a token is set
// (else the login form, 401).
func (h *Handler) page(f func(w http.ResponseWriter, r *http.Request, v *view)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ok, err := h.authed(r)
		if err != nil {
			h.internal(w, r, err)
			return
		}
		if !ok {
			if r.Header.Get("HX-Request") != "" {
				w.Header().Set("HX-Redirect", Prefix+"login")
			}
			h.renderLogin(w, r, http.StatusUnauthorized, "", r.URL.RequestURI())
			return
		}
		v := &view{CSRF: h.csrfToken(w, r), ReadOnly: h.cfg.ReadOnly, Auth: h.cfg.Token != "", Now: time.Now(),
			Interval: "every " + LiveInterval.String()}
		v.Flash = h.takeFlash(w, r)
		f(w, r, v)
	}
}

// action wraps a POST handler: session (401), read-only (403), CSRF token
// (403), then f, which answers (usually with h.done). ServeHTTP has
// refused cross-site requests before.
func (h *Handler) action(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ok, err := h.authed(r)
		if err != nil {
			h.internal(w, r, err)
			return
		}
		if !ok {
			h.fail(w, r, http.StatusUnauthorized, "log in first")
			return
		}
		if h.cfg.ReadOnly {
			h.fail(w, r, http.StatusForbidden, "the dashboard is read-only (INGEST_UI_READONLY)")
			return
		}
		if err := h.checkCSRF(r); err != nil {
			h.fail(w, r, http.StatusForbidden, err.Error())
			return
		}
		f(w, r)
	}
}

// checkCSRF checks the form's CSRF token (ServeHTTP has refused
// cross-site requests before).
func (h *Handler) checkCSRF(r *http.Request) error {
	r.Body = http.MaxBytesReader(nil, r.Body, maxFormBytes)
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return errors.New("missing CSRF cookie: reload the page and try again")
	}
	if subtle.ConstantTimeCompare([]byte(r.PostFormValue(csrfField)), []byte(c.Value)) != 1 {
		return errors.New("invalid CSRF token: reload the page and try again")
	}
	return nil
}

// csrfToken returns the CSRF token of this browser, setting its cookie
// when it has none.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 43 {
		if _, err := base64.RawURLEncoding.DecodeString(c.Value); err == nil {
			return c.Value
		}
	}
	v := randomToken()
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: Prefix, HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode})
	return v
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

type loginView struct {
	Next  string
	Error string
}

func (h *Handler) renderLogin(w http.ResponseWriter, r *http.Request, code int, msg, next string) {
	v := &view{Title: "Log in", CSRF: h.csrfToken(w, r), Now: time.Now(), D: loginView{Next: safeNext(next), Error: msg}}
	h.render(w, r, code, "login", v)
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if ok, _ := h.authed(r); ok {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	h.renderLogin(w, r, http.StatusOK, "", r.URL.Query().Get("next"))
}

// login checks the token of the login form and sets the session cookie.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Token == "" {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	if err := h.checkCSRF(r); err != nil {
		h.fail(w, r, http.StatusForbidden, err.Error())
		return
	}
	next := r.PostFormValue("next")
	got := sha256.Sum256([]byte(strings.TrimSpace(r.PostFormValue("token"))))
	want := sha256.Sum256([]byte(h.cfg.Token))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		h.log.WarnContext(r.Context(), "ui login refused: wrong token", "remote", r.RemoteAddr)
		// Slow guessing down (each wrong guess costs the guesser this much).
		time.Sleep(failedLoginDelay)
		h.renderLogin(w, r, http.StatusUnauthorized, "That token is not the one this server has (INGEST_API_TOKEN).", next)
		return
	}
	exp := time.Now().Add(SessionTTL)
	value, err := h.newSession(r.Context(), exp)
	if err != nil {
		h.internal(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: value, Path: Prefix, Expires: exp,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, safeNext(next), http.StatusSeeOther)
}

// logout ends the session on the server (every process refuses its cookie
// from then on) and forgets the cookie. When the session cannot be ended
// (PostgreSQL unavailable) the cookie is kept, so that the user sees the
// failure and can try again.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if err := h.checkCSRF(r); err != nil {
		h.fail(w, r, http.StatusForbidden, err.Error())
		return
	}
	if err := h.endSession(r); err != nil {
		h.internal(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext returns next when it is a path of the dashboard, else Prefix:
// a login never redirects off the site.
func safeNext(next string) string {
	if strings.HasPrefix(next, Prefix) && !strings.ContainsAny(next, "\\\r\n") && !strings.HasPrefix(next, "//") {
		return next
	}
	return Prefix
}

// done ends an action: a flash message for the next page, and a redirect
// to it (post/redirect/get).
func (h *Handler) done(w http.ResponseWriter, r *http.Request, to string, isErr bool, format string, args ...any) {
	h.stats.forget() // the next overview shows the change
	msg := fmt.Sprintf(format, args...)
	kind := "ok"
	if isErr {
		kind = "error"
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: base64.RawURLEncoding.EncodeToString([]byte(kind + "\n" + msg)),
		Path: Prefix, MaxAge: 60, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, safeNext(to), http.StatusSeeOther)
}

// takeFlash returns the flash message an action left, and clears it.
func (h *Handler) takeFlash(w http.ResponseWriter, r *http.Request) *flash {
	if r.URL.Query().Get("live") != "" {
		return nil
	}
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	raw, err := base64.RawURLEncoding.DecodeString(c.Value)
	if err != nil {
		return nil
	}
	kind, msg, _ := strings.Cut(string(raw), "\n")
	return &flash{Error: kind == "error", Msg: msg}
}

// fail answers an error page (or, for htmx, a plain message).
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	authed, _ := h.authed(r) // false when the session cannot be looked up
	v := &view{Title: http.StatusText(code), Now: time.Now(), Auth: h.cfg.Token != "" && authed,
		D: struct {
			Code int
			Msg  string
		}{code, msg}}
	if v.Auth {
		v.CSRF = h.csrfToken(w, r)
	}
	h.render(w, r, code, "error", v)
}

// UnavailableMsg is the page of a request that needed PostgreSQL or Redis
// while it could not be reached (503).
const UnavailableMsg = "database unavailable: PostgreSQL or Redis cannot be reached. " +
	"This page works again as soon as they answer; the reason is in the server's log."

// internal logs err and answers an error page without its text (which may
// name the database's user, host and port): 503 UnavailableMsg with
// Retry-After when PostgreSQL or Redis cannot be reached
// (httpguard.Unavailable), else 500.
func (h *Handler) internal(w http.ResponseWriter, r *http.Request, err error) {
	if httpguard.Unavailable(err) {
		h.log.WarnContext(r.Context(), "ui request failed: a database is unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", httpguard.RetryAfterHeader())
		h.fail(w, r, http.StatusServiceUnavailable, UnavailableMsg)
		return
	}
	h.log.ErrorContext(r.Context(), "ui request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	h.fail(w, r, http.StatusInternalServerError, "Internal error: the reason is in the server's log.")
}

// problem logs err, the failure of one part of a page (what: "Redis",
// "estimates"), and returns what the page may say about it: that the part
// is unavailable or failed, never the error's text (which may name the
// database's user, host and port), except a Redis server's own reply
// (redis.Error: "NOPERM ...", "WRONGTYPE ...").
func (h *Handler) problem(ctx context.Context, what string, err error) string {
	h.log.WarnContext(ctx, "ui: part of a page failed", "part", what, "err", err)
	var reply redis.Error
	switch {
	case httpguard.Unavailable(err):
		return what + " unavailable: cannot connect (the reason is in the server's log)"
	case errors.As(err, &reply):
		return what + ": " + reply.Error()
	default:
		return what + " failed (the reason is in the server's log)"
	}
}

// render executes a page: the whole document, or with ?live=1 only its
// live part.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, code int, page string, v *view) {
	t := h.pages[page]
	name := "layout"
	if r.URL.Query().Get("live") != "" && t.Lookup("live") != nil {
		name = "live"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, name, v); err != nil {
		h.log.ErrorContext(r.Context(), "ui template", "page", page, "err", err)
		http.Error(w, "template error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, visible(buf.String()))
}

// visible shows every control and bidirectional character of a page as a
// visible escape (termsafe.Text: "abc\u202edef", not "abcfed"; ESC as
// \x1b), keeping new lines and tabs. The templates hold none of these
// characters, so each one came from data (a kind, an error, a payload, a
// filter) whatever the template and field, which html/template escapes
// for HTML but not for display. A form field holding one shows the escape
// too, so a bulk redrive or filter re-submitted from the page uses the
// escaped text and matches no such name.
func visible(page string) string { return termsafe.Text(page) }

func (h *Handler) parseTemplates() error {
	base, err := template.New("base").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return fmt.Errorf("ui templates: %w", err)
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return err
	}
	h.pages = map[string]*template.Template{}
	for _, n := range names {
		page := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if page == "layout" {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return fmt.Errorf("ui template %s: %w", n, err)
		}
		h.pages[page] = t
	}
	return nil
}
