package main

import (
	"log/slog"
	"net/http"
	"time"
)

// httpServer is every HTTP server the binary starts (run's, which demo
// shares, and ui's): h behind the Host allow-list (httpguard.ForListen of
// INGEST_HTTP_ADDR and INGEST_HTTP_ALLOWED_HOSTS), which refuses any other
// Host before h sees the request. hosts is the list, for the start-up log
// line.
func (a *app) httpServer(h http.Handler) (srv *http.Server, hosts string, err error) {
	allowed, err := a.cfg.allowedHosts()
	if err != nil {
		return nil, "", usagef("INGEST_HTTP_ALLOWED_HOSTS: %v", err)
	}
	return &http.Server{
		Handler:           allowed.Handler(h, a.log.With("component", "http")),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}, allowed.String(), nil
}
