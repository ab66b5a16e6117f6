package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/migrations"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/ui"
)

// newUI returns the web dashboard on store; rdb nil: no Redis view
// (Kafka mode); reg nil: its counters are not exported (no /metrics).
func (a *app) newUI(store *task.Store, pool *pgxpool.Pool, rdb redis.UniversalClient, reg prometheus.Registerer) (*ui.Handler, error) {
	c := a.cfg
	cfg := ui.Config{Store: store, DB: pool, Token: c.APIToken, ReadOnly: c.UIReadOnly, Registerer: reg,
		Actor: "ui:" + c.ConsumerName, MaxAttempts: c.MaxAttempts, Logger: a.log.With("component", "ui"),
		Retention: c.retention().Tasks,
		Periodic:  func(now time.Time) []maintenance.Slot { return maintenance.NextSlots(c.periodic(), now) }}
	if rdb != nil {
		cfg.Redis, cfg.Stream, cfg.Group, cfg.DLQKey = rdb, c.StreamKey, c.Group, c.DLQStreamKey
	}
	h, err := ui.New(cfg)
	if err != nil {
		return nil, usageErr(err)
	}
	return h, nil
}

// readOnly passes only reads (GET, HEAD) to next; other methods get 405.
func readOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMethodNotAllowed)
			_, _ = w.Write([]byte(`{"error":"ingest-worker ui serves the task API read-only: use run's API to change tasks"}` + "\n"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// withUI serves the dashboard under /ui/ and next everything else; / (the
// address a browser is pointed at) redirects to the dashboard wherever it
// is served (run, demo, ui).
func withUI(dash *ui.Handler, next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(ui.Prefix, dash)
	mux.Handle("GET /ui", http.RedirectHandler(ui.Prefix, http.StatusMovedPermanently))
	mux.Handle("GET /{$}", http.RedirectHandler(ui.Prefix, http.StatusFound))
	if next != nil {
		mux.Handle("/", next)
	}
	return mux
}

// handler is what a worker's HTTP server serves: the API and probes, and
// the dashboard under /ui/.
func (s *stack) handler() (http.Handler, error) {
	dash, err := s.a.newUI(s.store, s.pool, s.rdb, s.reg)
	if err != nil {
		return nil, err
	}
	return withUI(dash, s.api), nil
}

const uiLong = `Serve the web dashboard at /ui/ on INGEST_HTTP_ADDR without running any
worker: the overview (tasks by status and kind, throughput, failures and
latency over the last 15 minutes, the stream, pending entries, DLQ depth,
outbox backlog, consumers, the leader), tasks with filters, one task in
depth (row, audit trail, outbox rows, PEL entry, DLQ entry) with cancel and
redrive, the DLQ with redrive of one entry or by filter after a dry run, and
kinds with pause, resume and limits. 'run' and 'demo' serve the same dashboard next to
their API (and / redirects to /ui/ there too). Pages update themselves every 2 seconds.

With INGEST_API_TOKEN set the dashboard asks for the token once and keeps a
session cookie; with INGEST_UI_READONLY=true it shows no action buttons and
refuses actions (403). Beside the dashboard it serves the task API's reads
(GET /v1/tasks, /v1/tasks/{id}, /v1/kinds, /v1/periodic, with the same
token; other methods get 405) and /healthz; / redirects to /ui/.

It answers only requests for the loopback names, INGEST_HTTP_ADDR's host (with
0.0.0.0: the machine's host name and addresses) and the names in
INGEST_HTTP_ALLOWED_HOSTS; list the name people type, for example
INGEST_HTTP_ALLOWED_HOSTS=dashboard.example.com.`

func (a *app) uiCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Serve the web dashboard (/ui/) and the read-only task API on INGEST_HTTP_ADDR, without running workers",
		Long:  uiLong,
		Example: `  ingest-worker ui --http-addr 127.0.0.1:8081
  INGEST_API_TOKEN=secret INGEST_UI_READONLY=true ingest-worker ui`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			if a.cfg.HTTPAddr == "" {
				return usagef("INGEST_HTTP_ADDR is empty: set the address the dashboard listens on")
			}
			ctx := cmd.Context()
			pool, rdb, closeAll, err := a.mode().openServers(ctx)
			if err != nil {
				return err
			}
			defer closeAll()
			if err := migrations.Check(ctx, pool); err != nil {
				return fmt.Errorf("schema check: %w", err)
			}
			store, err := a.listeningStore(ctx, pool)
			if err != nil {
				return err
			}
			dash, err := a.newUI(store, pool, rdb, nil)
			if err != nil {
				return err
			}
			// Beside the dashboard: the task API's reads and the probes.
			apiSrv, err := api.New(api.Config{Token: a.cfg.APIToken, Logger: a.log.With("component", "api"),
				Periodic: func(now time.Time) []maintenance.Slot { return maintenance.NextSlots(a.cfg.periodic(), now) }},
				store, nil, nil)
			if err != nil {
				return usageErr(err)
			}
			rest := http.NewServeMux()
			rest.Handle("/", readOnly(apiSrv))
			ln, err := net.Listen("tcp", a.cfg.HTTPAddr)
			if err != nil {
				return fmt.Errorf("INGEST_HTTP_ADDR: listen on %s: %w", a.cfg.HTTPAddr, err)
			}
			srv, allowedHosts, err := a.httpServer(withUI(dash, rest))
			if err != nil {
				_ = ln.Close()
				return err
			}
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ln) }()
			a.log.Info("ingest-worker dashboard running", "url", "http://"+ln.Addr().String()+ui.Prefix,
				"auth", a.cfg.APIToken != "", "read_only", a.cfg.UIReadOnly, "database", a.dbShown(), "http_allowed_hosts", allowedHosts)
			select {
			case err := <-done:
				return fmt.Errorf("http server: %w", err)
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Warn("http server shutdown", "err", err)
			}
			return nil
		},
	}
	for _, env := range []string{"INGEST_HTTP_ADDR", "INGEST_HTTP_ALLOWED_HOSTS", "INGEST_API_TOKEN", "INGEST_UI_READONLY"} {
		addFlag(cmd.Flags(), settingFlag(env))
	}
	return cmd
}
