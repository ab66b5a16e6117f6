package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/ui"
)

// HoldSummary compares a run's steady periods (tasks inserted throughout
// the period, the first period left out as warm-up) without and with the
// transactions of Options.Hold open.
type HoldSummary struct {
	After    string `json:"after"`
	Duration string `json:"duration"`
	// Clean are the periods the transactions did not overlap, Held
	// those they overlapped.
	Clean PhaseSummary `json:"clean"`
	Held  PhaseSummary `json:"held"`
	// ThroughputRatio is Held.TasksPerSecond / Clean.TasksPerSecond.
	ThroughputRatio float64 `json:"throughput_ratio"`
	// MaxDeadTuples is the most dead row versions each table had at the
	// end of a held period.
	MaxDeadTuples map[string]int64 `json:"max_dead_tuples"`
}

// PhaseSummary sums the periods of a phase.
type PhaseSummary struct {
	Periods        int         `json:"periods"`
	Seconds        float64     `json:"seconds"`
	TasksPerSecond float64     `json:"tasks_per_second"`
	StartMS        Percentiles `json:"start_ms"`
	RescuePageMS   Percentiles `json:"rescue_page_ms"`
}

// phase accumulates a PhaseSummary.
type phase struct {
	periods   int
	seconds   float64
	succeeded int64
	start     histogram
	rescue    histogram
}

func (p *phase) summary() PhaseSummary {
	s := PhaseSummary{Periods: p.periods, Seconds: p.seconds, StartMS: p.start.percentiles(), RescuePageMS: p.rescue.percentiles()}
	if p.seconds > 0 {
		s.TasksPerSecond = float64(p.succeeded) / p.seconds
	}
	return s
}

// series takes a run's samples.
type series struct {
	b       *run
	reg     *prometheus.Registry
	probe   *RescueProbe
	http    *soakHTTP
	out     *seriesWriter
	start   time.Time
	samples []Sample

	// holdFrom and holdTo are the Unix nanoseconds the held
	// transactions began and ended (0: not yet).
	holdFrom, holdTo atomic.Int64
	// inserting is true while the producers run.
	inserting atomic.Bool

	clean, held phase
	maxDead     map[string]int64
	deleted     int64 // retention's counter at the previous sample
}

// startSeries starts the sampling of the series, the rescuer probe and
// the hold of Options.Hold; the returned function stops them and returns
// the samples.
func (b *run) startSeries(ctx context.Context, reg *prometheus.Registry, start time.Time) (func() *series, error) {
	o := b.opts
	if o.Sample <= 0 {
		return func() *series { return nil }, nil
	}
	s := &series{b: b, reg: reg, probe: NewRescueProbe(b.pool), out: newSeriesWriter(o.SeriesOut, o.Soak), start: start,
		maxDead: map[string]int64{}}
	if o.Soak {
		store, err := task.NewStore(b.storeConfig(), b.pool)
		if err != nil {
			return nil, err
		}
		dash, err := ui.New(ui.Config{Store: store, DB: b.pool, Redis: b.rdb, Stream: b.stream, Group: "bench", DLQKey: b.dlq,
			Retention: task.Windows{Succeeded: o.Retention}})
		if err != nil {
			return nil, err
		}
		srv, err := api.New(api.Config{}, store, nil, reg)
		if err != nil {
			return nil, err
		}
		s.http = &soakHTTP{handlers: map[string]http.Handler{}}
		for _, r := range SoakRoutes {
			if r == "GET /ui/" || r == "GET /ui/tasks" {
				s.http.handlers[r] = dash
			} else {
				s.http.handlers[r] = srv
			}
		}
	}
	s.inserting.Store(true)
	b.series = s
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { s.probe.Run(ctx) })
	if o.Hold > 0 {
		wg.Go(func() {
			if err := s.hold(ctx); err != nil && ctx.Err() == nil {
				fmt.Fprintf(b.out, "hold: %v\n", err)
			}
		})
	}
	done := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		t := time.NewTicker(o.Sample)
		defer t.Stop()
		last := start
		var lastOK int64
		for {
			select {
			case <-done:
				s.take(ctx, last, time.Now(), &lastOK)
				return
			case now := <-t.C:
				s.take(ctx, last, now, &lastOK)
				last = now
			}
		}
	})
	var once sync.Once
	return func() *series {
		once.Do(func() {
			close(done)
			sampling.Wait() // its last sample reads with ctx, before the cancel
			cancel()
			wg.Wait()
		})
		return s
	}, nil
}

// hold opens the two transactions at HoldAfter and ends them after Hold
// (or when ctx is done).
func (s *series) hold(ctx context.Context) error {
	o := s.b.opts
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(o.HoldAfter):
	}
	cfg := s.b.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "ingest-bench-hold"
	idle, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer idle.Close(context.WithoutCancel(ctx))
	reader, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer reader.Close(context.WithoutCancel(ctx))
	tx1, err := idle.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx1.Exec(ctx, `SELECT txid_current()`); err != nil {
		return err
	}
	tx2, err := reader.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	if _, err := tx2.Exec(ctx, `SELECT id FROM ingest_task LIMIT 1`); err != nil {
		return err
	}
	s.holdFrom.Store(time.Now().UnixNano())
	fmt.Fprintf(s.b.out, "%6.1fs  holding a transaction idle in transaction and a REPEATABLE READ reader for %s\n", time.Since(s.start).Seconds(), o.Hold)
	select {
	case <-ctx.Done():
	case <-time.After(o.Hold):
	}
	s.holdTo.Store(time.Now().UnixNano())
	rctx := context.WithoutCancel(ctx)
	err = errors.Join(tx1.Rollback(rctx), tx2.Rollback(rctx))
	fmt.Fprintf(s.b.out, "%6.1fs  released the held transactions\n", time.Since(s.start).Seconds())
	return err
}

// held reports whether the hold overlapped [from, to].
func (s *series) heldDuring(from, to time.Time) bool {
	f := s.holdFrom.Load()
	if f == 0 || f > to.UnixNano() {
		return false
	}
	e := s.holdTo.Load()
	return e == 0 || e >= from.UnixNano()
}

// take samples the period [from, to].
func (s *series) take(ctx context.Context, from, to time.Time, lastOK *int64) {
	b := s.b
	steady := s.inserting.Load()
	ok := b.succeeded.Load()
	sec := to.Sub(from).Seconds()
	smp := Sample{At: to.Sub(s.start).Seconds(), Held: s.heldDuring(from, to), Inserted: b.inserted.Load(), Succeeded: ok,
		RSSMiB: float64(CurrentRSS()) / (1 << 20)}
	if sec > 0 {
		smp.TasksPerSecond = float64(ok-*lastOK) / sec
	}
	*lastOK = ok
	win := b.track.takeWindow()
	smp.StartMS = win.percentiles()
	rescue := s.probe.take()
	smp.RescuePageMS = rescue.percentiles()
	snap := b.counters.Snapshot()
	d := snap.Sub(b.lastSnap)
	smp.Statements = topStatements(d, 12)
	if d.Deletes.N > 0 {
		smp.Deletes = StatementTime{Statement: "DELETE", Count: d.Deletes.N, TotalMS: ms(d.Deletes.D), MeanMS: ms(d.Deletes.D) / float64(d.Deletes.N)}
	}
	b.lastSnap = snap
	if del := retentionDeleted(s.reg); del >= s.deleted {
		smp.RetentionDeleted = del - s.deleted
		s.deleted = del
		if sec > 0 {
			smp.RetentionPerSecond = float64(smp.RetentionDeleted) / sec
		}
	}
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if t, err := readTables(qctx, b.pool, b.opts.Soak); err == nil {
		smp.Tables = t
	} else {
		fmt.Fprintf(b.out, "sample: %v\n", err)
	}
	if s.http != nil {
		smp.HTTPMS = s.http.time(qctx)
	}
	s.samples = append(s.samples, smp)
	s.out.write(smp)
	s.printSample(smp)

	// The hold's summary: steady periods only, the first left out.
	if !steady || !s.inserting.Load() || len(s.samples) == 1 || b.opts.Hold == 0 {
		return
	}
	p := &s.clean
	if smp.Held {
		p = &s.held
		for name, t := range smp.Tables {
			s.maxDead[name] = max(s.maxDead[name], t.DeadTuples)
		}
	}
	p.periods++
	p.seconds += sec
	p.succeeded += int64(smp.TasksPerSecond*sec + 0.5)
	p.start.add(win)
	p.rescue.add(rescue)
}

func (s *series) printSample(smp Sample) {
	held := ""
	if smp.Held {
		held = " held"
	}
	dead := ""
	for _, name := range Tables {
		dead += fmt.Sprintf(" %s %d", name, smp.Tables[name].DeadTuples)
	}
	fmt.Fprintf(s.b.out, "%6.1fs%s  %7.0f tasks/s  start p50 %.1f p99 %.1f ms  rescuer page p99 %.1f ms (%d)  dead:%s\n",
		smp.At, held, smp.TasksPerSecond, smp.StartMS.P50, smp.StartMS.P99, smp.RescuePageMS.P99, smp.RescuePageMS.Count, dead)
	if smp.HTTPMS != nil {
		line := ""
		for _, r := range SoakRoutes {
			line += fmt.Sprintf("  %s %.1f ms", r, smp.HTTPMS[r])
		}
		var total int64
		for _, name := range Tables {
			total += smp.Tables[name].TotalBytes
		}
		fmt.Fprintf(s.b.out, "         %s  tables %.0f MiB  retention %.0f/s (%d deletes, %.1f ms each)  rss %.0f MiB\n", line, float64(total)/(1<<20),
			smp.RetentionPerSecond, smp.Deletes.Count, smp.Deletes.MeanMS, smp.RSSMiB)
	}
}

// holdSummary returns the comparison of the hold's phases (nil without a
// hold).
func (s *series) holdSummary() *HoldSummary {
	if s == nil || s.b.opts.Hold == 0 {
		return nil
	}
	h := &HoldSummary{After: s.b.opts.HoldAfter.String(), Duration: s.b.opts.Hold.String(),
		Clean: s.clean.summary(), Held: s.held.summary(), MaxDeadTuples: s.maxDead}
	if h.Clean.TasksPerSecond > 0 {
		h.ThroughputRatio = h.Held.TasksPerSecond / h.Clean.TasksPerSecond
	}
	return h
}
