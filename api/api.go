package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/configerr"
	"github.com/ingest-worker/ingest/internal/httpguard"
	"github.com/ingest-worker/ingest/internal/opsmetrics"
	"github.com/ingest-worker/ingest/internal/termsafe"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// Defaults for Config.
const (
	// DefaultEnvelopeBytes is what a create request may carry beyond the
	// payload limit (kind, idempotency key, JSON syntax).
	DefaultEnvelopeBytes = 64 << 10
	DefaultMaxBatchSize  = 1000
	DefaultMaxBatchBytes = 16 << 20
	DefaultReadyTimeout  = 5 * time.Second
	DefaultActor         = "api"
)

// Config configures a Server. Zero fields take the Default* values.
type Config struct {
	// Token, when set, is required as "Authorization: Bearer <Token>" on
	// the task API (/v1/).
	Token string
	// MaxBodyBytes bounds the body of POST /v1/tasks; default: the store's
	// MaxPayloadBytes plus DefaultEnvelopeBytes.
	MaxBodyBytes int64
	// MaxBatchBodyBytes bounds the body of POST /v1/tasks:batch; default:
	// the larger of MaxBodyBytes and DefaultMaxBatchBytes.
	MaxBatchBodyBytes int64
	// MaxBatchSize bounds the number of tasks in one batch.
	MaxBatchSize int
	// ReadyTimeout bounds the readiness checks of one /readyz request.
	ReadyTimeout time.Duration
	// Actor is recorded as the worker of redrive, cancel and run-now audit
	// rows, and logged with each deletion.
	Actor string
	// Logger receives server-side failures (5xx); nil discards them.
	Logger *slog.Logger
	// Periodic, when set, returns the next slot of each periodic schedule
	// (GET /v1/periodic); nil: none are configured.
	Periodic func(now time.Time) []maintenance.Slot
	// DLQClient and DLQKey name the DLQ stream whose entries of redriven
	// tasks a bulk redrive (POST /v1/tasks/redrive) removes, as dlq replay
	// does, and of deleted tasks a delete removes; nil or "": none (Kafka
	// mode, or no DLQ). With DLQClient set, a delete also removes the
	// deleted task's entries from the task stream (dlq.Delete).
	DLQClient redis.UniversalClient
	DLQKey    string
	// Registerer, when set, receives the counter of deleted tasks
	// (ingest_task_deleted_total, via="api").
	Registerer prometheus.Registerer
}

// Check reports whether one dependency is usable: nil when it is.
type Check func(ctx context.Context) error

// Checks are named readiness checks ("postgres", "redis", "schema"); /readyz
// runs them all concurrently and is ready when every one returns nil.
type Checks map[string]Check

// Server serves the routes listed in the package documentation.
type Server struct {
	cfg      Config
	store    *task.Store
	checks   Checks
	maxBytes int // the store's payload limit
	mux      *http.ServeMux
	routes   []string // the mux's patterns (Routes)
	log      *slog.Logger
	token    [sha256.Size]byte

	deleted prometheus.Counter // ingest_task_deleted_total{via="api"}

	// awaiter serves GET /v1/tasks/{id}?wait=: one LISTEN connection for
	// all of the server's waits.
	awaiter *task.Awaiter

	checkMu   sync.Mutex
	checkLast map[string]string // each readiness check's last error ("": ok)
}

// New returns a Server on store. ready may be nil (always ready); gatherer
// may be nil (no /metrics).
func New(cfg Config, store *task.Store, ready Checks, gatherer prometheus.Gatherer) (*Server, error) {
	if store == nil {
		return nil, errors.New("api: a task store is required")
	}
	switch {
	case cfg.MaxBodyBytes < 0:
		return nil, configerr.New("api", nil, "MaxBodyBytes", "must be at least 0, got %d", cfg.MaxBodyBytes)
	case cfg.MaxBatchBodyBytes < 0:
		return nil, configerr.New("api", nil, "MaxBatchBodyBytes", "must be at least 0, got %d", cfg.MaxBatchBodyBytes)
	case cfg.MaxBatchSize < 0:
		return nil, configerr.New("api", nil, "MaxBatchSize", "must be at least 0, got %d", cfg.MaxBatchSize)
	case cfg.ReadyTimeout < 0:
		return nil, configerr.New("api", nil, "ReadyTimeout", "must be at least 0s, got %s", cfg.ReadyTimeout)
	}
	s := &Server{cfg: cfg, store: store, checks: ready, maxBytes: store.Config().MaxPayloadBytes, log: cfg.Logger,
		checkLast: map[string]string{}}
	if s.cfg.MaxBodyBytes == 0 {
		s.cfg.MaxBodyBytes = int64(s.maxBytes) + DefaultEnvelopeBytes
	}
	if s.cfg.MaxBatchBodyBytes == 0 {
		s.cfg.MaxBatchBodyBytes = max(s.cfg.MaxBodyBytes, DefaultMaxBatchBytes)
	}
	if s.cfg.MaxBatchSize == 0 {
		s.cfg.MaxBatchSize = DefaultMaxBatchSize
	}
	if s.cfg.ReadyTimeout == 0 {
		s.cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if s.cfg.Actor == "" {
		s.cfg.Actor = DefaultActor
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.token = sha256.Sum256([]byte(cfg.Token))
	s.awaiter = task.NewAwaiter(store, s.log)
	deleted, err := opsmetrics.Deleted(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("api: register metrics: %w", err)
	}
	s.deleted = deleted.WithLabelValues("api")

	routes := []route{
		{"GET /healthz", http.HandlerFunc(s.healthz)},
		{"GET /readyz", http.HandlerFunc(s.readyz)},
		{"GET /v1/openapi.json", http.HandlerFunc(serveOpenAPI)},
		{"POST /v1/tasks", s.auth(s.createTask)},
		{"POST /v1/tasks:batch", s.auth(s.createBatch)},
		{"GET /v1/tasks", s.auth(s.listTasks)},
		{"GET /v1/tasks/{id}", s.auth(s.getTask)},
		{"DELETE /v1/tasks/{id}", s.auth(s.deleteTask)},
		{"POST /v1/tasks/{id}/run", s.auth(s.runTaskNow)},
		{"POST /v1/tasks/redrive", s.auth(s.bulkRedrive)},
		{"POST /v1/tasks/{id}/redrive", s.auth(s.redriveTask)},
		{"POST /v1/tasks/{id}/cancel", s.auth(s.cancelTask)},
		{"POST /v1/tasks/{id}/progress", s.auth(s.setProgress)},
		{"GET /v1/periodic", s.auth(s.periodic)},
		{"GET /v1/kinds", s.auth(s.listKinds)},
		{"GET /v1/kinds/{kind}", s.auth(s.getKind)},
		{"PUT /v1/kinds/{kind}", s.auth(s.putKind)},
		{"GET /v1/sequences/blocked", s.auth(s.listBlockedSequences)},
	}
	if gatherer != nil {
		routes = append(routes, route{"GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{})})
	}
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.Handle(rt.pattern, rt.h)
		s.routes = append(s.routes, rt.pattern)
	}
	s.mux = mux
	return s, nil
}

// route is one pattern of the mux and its handler.
type route struct {
	pattern string
	h       http.Handler
}

// Routes returns the pattern ("METHOD /path") of every route s serves.
func (s *Server) Routes() []string { return slices.Clone(s.routes) }

// ServeHTTP implements http.Handler. A state-changing request that a
// browser sent on behalf of another site is refused with 403 before
// routing and authentication (httpguard.CrossSite).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if cs := httpguard.CrossSite(r); cs != nil {
		writeError(w, http.StatusForbidden, cs.Error(), cs.Header)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// auth requires the bearer token when one is configured.
func (s *Server) auth(next http.HandlerFunc) http.HandlerFunc {
	if s.cfg.Token == "" {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], s.token[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ingest-worker"`)
			writeError(w, http.StatusUnauthorized, "a valid bearer token is required", "Authorization")
			return
		}
		next(w, r)
	}
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyResponse is the body of /readyz.
type readyResponse struct {
	Status string            `json:"status"` // "ready" or "not ready"
	Checks map[string]string `json:"checks"` // "ok" or the error
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadyTimeout)
	defer cancel()
	names := make([]string, 0, len(s.checks))
	for name := range s.checks {
		names = append(names, name)
	}
	sort.Strings(names)
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { errs[i] = s.checks[name](ctx) })
	}
	wg.Wait()
	res := readyResponse{Status: "ready", Checks: make(map[string]string, len(names))}
	code := http.StatusOK
	for i, name := range names {
		s.logCheck(r.Context(), name, errs[i])
		res.Checks[name] = "ok"
		if errs[i] != nil {
			res.Checks[name] = checkText(errs[i])
			res.Status = "not ready"
			code = http.StatusServiceUnavailable
		}
	}
	writeJSON(w, code, res)
}

// unavailableCheck is a failing check's answer when its dependency cannot
// be reached.
const unavailableCheck = "unavailable: cannot connect (the reason is in the server's log)"

// checkText is what /readyz shows of a failing check: for a dependency that
// cannot be reached, not the error (it names the user, host and port), but
// that it is unavailable; any other error as it is (the schema check's
// "run ingest-worker migrate", "shutting down").
func checkText(err error) string {
	if httpguard.Unavailable(err) {
		return unavailableCheck
	}
	return err.Error()
}

// logCheck logs a readiness check's result when it changes: the reason of
// a failure, once, and the recovery.
func (s *Server) logCheck(ctx context.Context, name string, err error) {
	now := ""
	if err != nil {
		now = err.Error()
	}
	s.checkMu.Lock()
	before := s.checkLast[name]
	s.checkLast[name] = now
	s.checkMu.Unlock()
	switch {
	case now == before:
	case now == "":
		s.log.InfoContext(ctx, "readiness check passes again", "check", name)
	default:
		s.log.WarnContext(ctx, "readiness check failing", "check", name, "err", err)
	}
}

// errorResponse is the body of every error.
type errorResponse struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

func writeError(w http.ResponseWriter, code int, msg, field string) {
	writeJSON(w, code, errorResponse{Error: msg, Field: field})
}

// writeJSON answers v as JSON. The DEL, C1 and bidirectional controls of
// its strings are written as \u escapes (termsafe.JSON; the encoder escapes
// those below U+0020): the same strings, but a body shown on a terminal
// (curl) cannot drive it.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	_, _ = w.Write(termsafe.JSON(buf.Bytes()))
}

// UnavailableMsg is the error of a 503: PostgreSQL or Redis cannot be
// reached.
const UnavailableMsg = "database unavailable: PostgreSQL or Redis cannot be reached; retry after the Retry-After seconds"

// internalError logs err and answers without its text (which may name the
// database's user, host and port): 503 with Retry-After when PostgreSQL or
// Redis cannot be reached (httpguard.Unavailable), so that the client
// retries, else 500.
func (s *Server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if httpguard.Unavailable(err) {
		s.log.WarnContext(r.Context(), "api request failed: a database is unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		w.Header().Set("Retry-After", httpguard.RetryAfterHeader())
		writeError(w, http.StatusServiceUnavailable, UnavailableMsg, "")
		return
	}
	s.log.ErrorContext(r.Context(), "api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "internal error", "")
}

// PeriodicResponse is the body of GET /v1/periodic.
type PeriodicResponse struct {
	Schedules []maintenance.Slot `json:"schedules"`
}

// periodic answers the next slot of every periodic schedule.
func (s *Server) periodic(w http.ResponseWriter, _ *http.Request) {
	out := PeriodicResponse{Schedules: []maintenance.Slot{}}
	if s.cfg.Periodic != nil {
		out.Schedules = append(out.Schedules, s.cfg.Periodic(time.Now())...)
	}
	writeJSON(w, http.StatusOK, out)
}
