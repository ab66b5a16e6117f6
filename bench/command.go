package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

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

// Flags are the command-line settings that the comparison's programs
// (bench/river, bench/floor) share, with the bench's defaults.
type Flags struct {
	// Mode is preload or continuous; Jobs how many jobs a run inserts and
	// works.
	Mode string
	Jobs int
	// Producers, InsertBatch and PoolConns are the bench's inserters,
	// jobs per insert and PostgreSQL connections.
	Producers   int
	InsertBatch int
	PoolConns   int
	Timeout     time.Duration
	// Keep leaves the run's rows; JSON prints the report as JSON.
	Keep bool
	JSON bool
}

// Register defines the flags on fs; rows names what --keep leaves.
func (f *Flags) Register(fs *flag.FlagSet, rows string) {
	fs.StringVar(&f.Mode, "mode", "preload", "preload (insert all, then work) or continuous (insert while working)")
	fs.IntVar(&f.Jobs, "jobs", 200000, "jobs to insert and work")
	fs.IntVar(&f.Producers, "producers", DefaultProducers, "concurrent inserters")
	fs.IntVar(&f.InsertBatch, "insert-batch", DefaultInsertBatch, "jobs per insert")
	fs.IntVar(&f.PoolConns, "pool-conns", DefaultPoolConns, "PostgreSQL connections")
	fs.DurationVar(&f.Timeout, "timeout", DefaultTimeout, "give up after this long")
	fs.BoolVar(&f.Keep, "keep", false, "leave the run's "+rows+" (otherwise emptied at the end)")
	fs.BoolVar(&f.JSON, "json", false, "print the result as JSON")
}

// Validate names the first bad flag.
func (f Flags) Validate() error {
	switch {
	case f.Mode != "preload" && f.Mode != "continuous":
		return fmt.Errorf("--mode must be preload or continuous, got %q", f.Mode)
	case f.Jobs < 1:
		return fmt.Errorf("--jobs must be >= 1, got %d", f.Jobs)
	case f.Producers < 1 || f.Producers > 64:
		return fmt.Errorf("--producers must be in [1, 64], got %d", f.Producers)
	case f.InsertBatch < 1 || f.InsertBatch > 10000:
		return fmt.Errorf("--insert-batch must be in [1, 10000], got %d", f.InsertBatch)
	case f.PoolConns < 4 || f.PoolConns > MaxPoolConns:
		return fmt.Errorf("--pool-conns must be in [4, %d], got %d", MaxPoolConns, f.PoolConns)
	case f.Timeout <= 0:
		return fmt.Errorf("--timeout must be > 0, got %s", f.Timeout)
	}
	return nil
}

// Parse parses the command line into fs and checks it with validate; a
// bad flag exits with status 2, the error printed after the program's
// name.
func Parse(name string, fs *flag.FlagSet, validate func() error) {
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if err := validate(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
}
