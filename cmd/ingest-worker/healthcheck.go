package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"
)

func (a *app) healthcheckCommand() *cobra.Command {
	var ready bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Probe a running worker's /healthz (or /readyz) on INGEST_HTTP_ADDR; exit 0 if healthy",
		Long: `Ask the worker listening on INGEST_HTTP_ADDR whether it is alive (/healthz) or,
with --ready, ready (/readyz: PostgreSQL and Redis reachable, schema current).
Exit code 0 when it answers 200, 1 otherwise. Meant for container health
checks in images without curl (a listen address of 0.0.0.0 or [::] is probed
on the loopback interface).`,
		Example: `  ingest-worker healthcheck
  ingest-worker healthcheck --ready --http-addr 127.0.0.1:8080`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := a.load(cmd, nil); err != nil {
				return err
			}
			if a.cfg.HTTPAddr == "" {
				return usagef("INGEST_HTTP_ADDR is empty: the worker serves no probes")
			}
			if timeout <= 0 {
				return usagef("--timeout must be > 0, got %s", timeout)
			}
			host, port, _ := net.SplitHostPort(a.cfg.HTTPAddr)
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				host = "127.0.0.1"
			}
			path := "/healthz"
			if ready {
				path = "/readyz"
			}
			url := "http://" + net.JoinHostPort(host, port) + path
			client := &http.Client{Timeout: timeout}
			resp, err := client.Get(url)
			if err != nil {
				return fmt.Errorf("probe %s: %w", url, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("probe %s: %s: %s", url, resp.Status, body)
			}
			a.printf("%s\n", bytes.TrimRight(body, "\n"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&ready, "ready", false, "probe /readyz instead of /healthz")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "give up after this long")
	f := settingFlag("INGEST_HTTP_ADDR")
	addFlag(cmd.Flags(), f)
	return cmd
}
