package ui

import (
	"context"
	"fmt"
	"html/template"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/ingest-worker/ingest/task"
)

// The charts cover Window in buckets of Bucket.
const (
	Bucket      = 30 * time.Second
	Window      = 15 * time.Minute
	sampleEvery = time.Second
	// sampleBatch bounds the audit rows one pass reads; a backlog (the
	// first pass after an idle spell at high throughput) is caught up over
	// several passes, catchUpPause apart.
	sampleBatch = 50000
)

// agg sums the transitions of one bucket and kind.
type agg struct {
	Created, Started, Succeeded, Retried, Dead, Cancelled int64
	// LatSum and LatMax are seconds from when a task was due (its
	// creation, or its later due_at: a delayed task's run_at, a run-now,
	// a redrive; task.AuditSamples) to its SUCCEEDED transition; LatN
	// counts them.
	LatSum, LatMax float64
	LatN           int64
}

func (a *agg) add(b agg) {
	a.Created += b.Created
	a.Started += b.Started
	a.Succeeded += b.Succeeded
	a.Retried += b.Retried
	a.Dead += b.Dead
	a.Cancelled += b.Cancelled
	a.LatSum += b.LatSum
	a.LatN += b.LatN
	a.LatMax = max(a.LatMax, b.LatMax)
}

// series is what the charts show.
type series struct {
	Start  time.Time
	Points []agg // one per Bucket from Start
	Totals agg
	ByKind map[string]agg
	// Behind is true while the sampler is catching up (its last pass read
	// a full batch); Through is then the newest audit time read.
	Behind  bool
	Through time.Time
	// Charts are inline SVG.
	Throughput, Failures, Latency template.HTML
}

// sampler keeps the transitions of the last Window per bucket and kind,
// in process. A goroutine of its own reads the audit table
// (ingest_task_transition) incrementally, while the dashboard is being
// looked at (Series was called within sampleIdle): it starts with the
// first Series call after an idle spell and stops sampleIdle after the
// last. Each pass reads only the rows after the last id it saw that were
// created at most sampleSlack before the newest one it saw, on the BRIN
// index of created_at (the table is only appended to), so a pass costs
// what was written since the last one, not the window. The first pass
// starts at the first row of the window (task.AuditWindowStart,
// task.AuditSamples). A request never waits for the reads beyond
// firstWait: at 1,500 tasks/s a minute of audit rows is 270,000 rows, and
// reading them inside the request made the overview take seconds. The
// charts show what has been read (series.Through).
//
// An audit row whose transaction commits after a row with a larger id
// was read is not counted (ids are taken before commit); the charts may
// miss such a row, nothing else depends on them.
type sampler struct {
	db    task.DB
	batch int // audit rows per pass (sampleBatch)

	mu      sync.Mutex // guards the fields below
	buckets map[int64]map[string]*agg
	through time.Time // the newest created_at read
	behind  bool      // the last pass read a full batch
	viewed  time.Time // the last Series call
	running bool      // the reading goroutine runs
	passed  chan struct{}
	err     error // the last pass's

	// Owned by the reading goroutine (one at a time: running).
	started bool
	lastID  int64
	lastAt  time.Time
}

func newSampler(db task.DB) *sampler {
	return &sampler{db: db, batch: sampleBatch, buckets: map[int64]map[string]*agg{}}
}

const (
	// sampleSlack is how much older than the newest audit row read a row
	// that commits later may be (its transaction began earlier) and still
	// be counted. Each pass reads the rows of this span again (and skips
	// them by id), so it is short.
	sampleSlack = 10 * time.Second
	// sampleIdle is how long after the last Series call the reading
	// goroutine keeps reading.
	sampleIdle = 2 * time.Minute
	// catchUpPause is the shortest pause between passes that read a full
	// batch; the pause is at least as long as the pass took, so catching
	// up on a busy database takes at most half of one database CPU.
	catchUpPause = 50 * time.Millisecond
	// firstWait is how long Series waits for the reading goroutine's
	// first pass when it starts it.
	firstWait = 250 * time.Millisecond
	// passTimeout bounds one pass's reads.
	passTimeout = 30 * time.Second
)

// read is the reading goroutine: a pass, then a pause (sampleEvery; while
// behind, as long as the pass took and at least catchUpPause), until the
// dashboard has not been looked at for sampleIdle or a pass fails (the
// next Series call starts it again).
func (s *sampler) read(passed chan struct{}) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), passTimeout)
		begun := time.Now()
		behind, err := s.pass(ctx)
		took := time.Since(begun)
		cancel()
		s.mu.Lock()
		s.err = err
		if passed != nil {
			close(passed)
			passed = nil
		}
		if err != nil || time.Since(s.viewed) > sampleIdle {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if behind {
			time.Sleep(max(catchUpPause, took))
		} else {
			time.Sleep(sampleEvery)
		}
	}
}

// pass reads one batch of the audit rows written since the last pass and
// adds them to the buckets; behind is true when the batch was full.
func (s *sampler) pass(ctx context.Context) (behind bool, err error) {
	if !s.started {
		id, err := task.AuditWindowStart(ctx, s.db, Window)
		if err != nil {
			return false, err
		}
		s.lastID = id
		s.started = true
	}
	since := time.Now().Add(-Window)
	if s.lastAt.After(since.Add(sampleSlack)) {
		since = s.lastAt.Add(-sampleSlack)
	}
	samples, err := task.AuditSamples(ctx, s.db, s.lastID, since, s.batch, Bucket)
	if err != nil {
		return false, err
	}
	var seen int64
	for _, x := range samples {
		s.lastID = max(s.lastID, x.MaxID)
		if x.MaxAt.After(s.lastAt) {
			s.lastAt = x.MaxAt
		}
		seen += x.N
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range samples {
		byKind := s.buckets[x.Bucket]
		if byKind == nil {
			byKind = map[string]*agg{}
			s.buckets[x.Bucket] = byKind
		}
		a := byKind[x.Kind]
		if a == nil {
			a = &agg{}
			byKind[x.Kind] = a
		}
		switch {
		case x.Created:
			a.Created += x.N
		case x.To == task.Running:
			a.Started += x.N
		case x.To == task.Succeeded:
			a.Succeeded += x.N
			a.LatSum += x.LatSum
			a.LatN += x.N
			a.LatMax = max(a.LatMax, x.LatMax)
		case x.To == task.Retrying:
			a.Retried += x.N
		case x.To == task.Dead:
			a.Dead += x.N
		case x.To == task.Cancelled:
			a.Cancelled += x.N
		}
	}
	s.through, s.behind = s.lastAt, seen >= int64(s.batch)
	step := int64(Bucket / time.Second)
	oldest := time.Now().Add(-Window-Bucket).Unix() / step
	for b := range s.buckets {
		if b < oldest {
			delete(s.buckets, b)
		}
	}
	return seen >= int64(s.batch), nil
}

// Series returns the charts of what has been read, and the last pass's
// error. It starts the reading goroutine when it is not running, and then
// waits at most firstWait for its first pass.
func (s *sampler) Series(ctx context.Context) (series, error) {
	s.mu.Lock()
	s.viewed = time.Now()
	if !s.running {
		s.running = true
		s.passed = make(chan struct{})
		go s.read(s.passed)
	}
	passed := s.passed
	s.mu.Unlock()
	t := time.NewTimer(firstWait)
	select {
	case <-passed:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	step := int64(Bucket / time.Second)
	n := int(Window / Bucket)
	last := time.Now().Unix() / step
	first := last - int64(n) + 1
	out := series{Start: time.Unix(first*step, 0), Points: make([]agg, n), ByKind: map[string]agg{}, Behind: s.behind, Through: s.through}
	for b, byKind := range s.buckets {
		if b < first || b > last {
			continue
		}
		for k, a := range byKind {
			out.Points[b-first].add(*a)
			out.Totals.add(*a)
			if k != "" { // creations, starts and cancellations (task.AuditSample)
				t := out.ByKind[k]
				t.add(*a)
				out.ByKind[k] = t
			}
		}
	}
	per := func(f func(a agg) float64) []float64 {
		v := make([]float64, n)
		for i, p := range out.Points {
			v[i] = f(p)
		}
		return v
	}
	perMin := 60 / Bucket.Seconds()
	out.Throughput = chart("tasks per minute", "", []line{
		{"created", "s-created", per(func(a agg) float64 { return float64(a.Created) * perMin })},
		{"succeeded", "s-ok", per(func(a agg) float64 { return float64(a.Succeeded) * perMin })},
	})
	out.Failures = chart("failures per minute", "", []line{
		{"retried", "s-retry", per(func(a agg) float64 { return float64(a.Retried) * perMin })},
		{"dead", "s-dead", per(func(a agg) float64 { return float64(a.Dead) * perMin })},
	})
	out.Latency = chart("due → succeeded", "s", []line{
		{"average", "s-avg", per(func(a agg) float64 {
			if a.LatN == 0 {
				return 0
			}
			return a.LatSum / float64(a.LatN)
		})},
		{"max", "s-max", per(func(a agg) float64 { return a.LatMax })},
	})
	return out, err
}

// line is one series of a chart.
type line struct {
	Name, Class string
	V           []float64
}

// chart renders lines as an inline SVG (the values are numbers and the
// names constants: nothing here comes from a user).
func chart(title, unit string, lines []line) template.HTML {
	const w, h, left, top, bottom = 600.0, 160.0, 46.0, 12.0, 22.0
	top2 := 0.0
	n := 0
	for _, l := range lines {
		n = max(n, len(l.V))
		for _, v := range l.V {
			top2 = max(top2, v)
		}
	}
	ymax := niceCeil(top2)
	plotW, plotH := w-left-8, h-top-bottom
	x := func(i int) float64 {
		if n <= 1 {
			return left
		}
		return left + plotW*float64(i)/float64(n-1)
	}
	y := func(v float64) float64 { return top + plotH*(1-v/ymax) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %g %g" role="img" aria-label="%s">`, w, h, template.HTMLEscapeString(title))
	for i := 0; i <= 4; i++ {
		v := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<line class="grid" x1="%g" x2="%g" y1="%.1f" y2="%.1f"/>`, left, w-8, y(v), y(v))
		fmt.Fprintf(&b, `<text class="ylab" x="%g" y="%.1f">%s%s</text>`, left-4, y(v)+4, shortNum(v), unit)
	}
	mins := int(Window / time.Minute)
	for m := 0; m <= mins; m += 5 {
		i := int(float64(n-1) * float64(m) / float64(mins))
		label := "now"
		if m < mins {
			label = fmt.Sprintf("-%dm", mins-m)
		}
		class := "xlab"
		if m == mins {
			class += " end"
		}
		fmt.Fprintf(&b, `<text class="%s" x="%.1f" y="%g">%s</text>`, class, x(i), h-6, label)
	}
	for _, l := range lines {
		var pts strings.Builder
		for i, v := range l.V {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(i), y(v))
		}
		fmt.Fprintf(&b, `<polyline class="%s" points="%s"><title>%s</title></polyline>`, l.Class, strings.TrimSpace(pts.String()), l.Name)
	}
	b.WriteString(`</svg><p class="legend">`)
	for _, l := range lines {
		fmt.Fprintf(&b, `<span class="key %s">%s</span> `, l.Class, l.Name)
	}
	b.WriteString(`</p>`)
	return template.HTML(b.String())
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func shortNum(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", math.Round(v/1e5)/10)
	case v >= 1e3:
		return fmt.Sprintf("%gk", math.Round(v/1e2)/10)
	case v == math.Trunc(v):
		return fmt.Sprintf("%g", v)
	}
	return fmt.Sprintf("%.1f", v)
}
