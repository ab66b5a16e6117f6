// Command ingest-worker runs ingest tasks reliably (Postgres holds every
// task, a Redis Stream consumer group carries them to workers) and is the
// operator's tool to enqueue, inspect and replay them. Run
// `ingest-worker --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one kills the process at once.
		<-ctx.Done()
		stop()
	}()
	ownsProcess = true
	os.Exit(execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.LookupEnv))
}
