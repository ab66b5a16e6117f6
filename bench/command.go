package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"golang.org/x/sync/errgroup"
)

// Produce inserts total jobs with producers goroutines, handing each call
// of insert the next batch of at most batch jobs (n), until all are handed
// out or a call fails. It is the producers' loop of the comparison's
// programs (bench/river, bench/floor), so that they insert as the bench
// does.
func Produce(ctx context.Context, total, batch, producers int, insert func(ctx context.Context, n int) error) error {
	var next atomic.Int64 // jobs handed out
	g, ctx := errgroup.WithContext(ctx)
	for range producers {
		g.Go(func() error {
			for {
				first := next.Add(int64(batch)) - int64(batch)
				if first >= int64(total) {
					return nil
				}
				if err := insert(ctx, int(min(int64(batch), int64(total)-first))); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

// Main runs the work of a comparison program (bench/river, bench/floor)
// under a context that SIGINT and SIGTERM cancel, and prints its report:
// as indented JSON with asJSON, else with print. A failure is printed to
// stderr after the program's name and exits with status 1.
func Main[R any](name string, asJSON bool, run func(context.Context) (R, error), print func(io.Writer, R)) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx)
	if err == nil && asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		stop()
		os.Exit(1)
	}
	if !asJSON {
		print(os.Stdout, rep)
	}
}
