package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
)

// The worker processes of BenchmarkScaleProcesses are this test binary,
// run again with scaleChildEnv set to "<database URL> <Redis URL> <stream>
// <consumer>" (see TestMain).
const scaleChildEnv = "INGEST_SCALE_CHILD"

// scaleTasks is how many tasks each configuration of
// BenchmarkScaleProcesses works off (INGEST_SCALE_TASKS overrides it).
const scaleTasks = 40_000

// runScaleChild runs one worker process: a Service with a no-op handler
// for kind "scale", the default worker settings, until SIGTERM.
func runScaleChild(spec string) int {
	f := strings.Fields(spec)
	if len(f) != 4 {
		fmt.Fprintf(os.Stderr, "%s: want 4 fields, got %q\n", scaleChildEnv, spec)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, f[0])
	if err != nil {
		logger.Error("connect to PostgreSQL", "err", err)
		return 1
	}
	defer pool.Close()
	opt, err := redis.ParseURL(f[1])
	if err != nil {
		logger.Error("parse the Redis URL", "err", err)
		return 1
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	cfg := ingest.Config{Stream: f[2], Consumer: f[3]}
	svc, err := ingest.NewService(cfg, pool, ingest.Redis(rdb), logger, prometheus.NewRegistry())
	if err != nil {
		logger.Error("NewService", "err", err)
		return 1
	}
	svc.Handle("scale", func(context.Context, ingest.Task) error { return nil })
	if err := svc.Run(ctx); err != nil && ctx.Err() == nil {
		logger.Error("Run", "err", err)
		return 1
	}
	return 0
}

// BenchmarkScaleProcesses measures how throughput grows with worker
// processes: for 1, 2, 4 and 8 processes (each the default Service with a
// no-op handler, on its own pool) against one PostgreSQL and one Redis, it
// preloads scaleTasks tasks, starts the processes and times them working
// the tasks off; it reports tasks/s and the most PostgreSQL connections
// per process seen during the run. Run it with
//
//	go test -run '^$' -bench BenchmarkScaleProcesses -benchtime 1x ./bench/
func BenchmarkScaleProcesses(b *testing.B) {
	n := scaleTasks
	if v, err := strconv.Atoi(os.Getenv("INGEST_SCALE_TASKS")); err == nil && v > 0 {
		n = v
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for _, procs := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("procs=%d", procs), func(b *testing.B) {
			for range b.N {
				perSec, conns := scaleOnce(b, exe, procs, n)
				b.ReportMetric(perSec, "tasks/s")
				b.ReportMetric(conns, "peak-pg-conns/proc")
			}
		})
	}
}

func scaleOnce(b *testing.B, exe string, procs, n int) (perSec, connsPerProc float64) {
	ctx := context.Background()
	db := testenv.NewDatabase(b)
	redisURL := testenv.NewRedisServer(b).URL()
	stream := "scale:{" + strconv.Itoa(procs) + "}:tasks"
	store, err := task.NewStore(task.Config{Stream: stream}, db.Pool)
	if err != nil {
		b.Fatal(err)
	}
	for done := 0; done < n; done += 1000 {
		nts := make([]task.NewTask, min(1000, n-done))
		for i := range nts {
			nts[i] = task.NewTask{Kind: "scale", Payload: json.RawMessage(`{}`)}
		}
		if _, err := store.CreateBatch(ctx, nts); err != nil {
			b.Fatal(err)
		}
	}
	count := func(q string) int {
		var v int
		if err := db.Pool.QueryRow(ctx, q).Scan(&v); err != nil {
			b.Fatal(err)
		}
		return v
	}
	var cmds []*exec.Cmd
	var wg sync.WaitGroup
	start := time.Now()
	for i := range procs {
		dsn := db.URL + "&application_name=scale-" + strconv.Itoa(i)
		if !strings.Contains(db.URL, "?") {
			dsn = db.URL + "?application_name=scale-" + strconv.Itoa(i)
		}
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s w%d", scaleChildEnv, dsn, redisURL, stream, i))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		cmds = append(cmds, cmd)
		wg.Go(func() { _ = cmd.Wait() })
	}
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
		wg.Wait()
	}()
	peak := 0 // the most connections the processes held at a look
	testenv.Eventually(b, 10*time.Minute, "every task SUCCEEDED", func() bool {
		peak = max(peak, count(`SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'scale-%'`))
		return count(`SELECT count(*) FROM ingest_task WHERE status = 'SUCCEEDED'`) == n
	})
	elapsed := time.Since(start)
	return float64(n) / elapsed.Seconds(), float64(peak) / float64(procs)
}
