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
	// sampleBatch bounds the audit rows one read takes; a backlog (the
	// first read after start-up at high throughput) is caught up over
	// several reads, maxBatches per refresh.
	sampleBatch = 50000
	maxBatches  = 4
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
	// Charts are inline SVG.
	Throughput, Failures, Latency template.HTML
}

// sampler keeps the transitions of the last Window per bucket and kind,
// in process. It reads the audit table (ingest_task_transition)
// incrementally: each refresh reads only the rows after the last id it
// saw that were created at most sampleSlack before the newest one it saw,
// on the BRIN index of created_at (the table is only appended to), so a
// poll costs what was written since the last one, not the window. The
// first refresh starts at the first row of the window
// (task.AuditWindowStart, task.AuditSamples).
//
// An audit row whose transaction commits after a row with a larger id
// was read is not counted (ids are taken before commit); the charts may
// miss such a row, nothing else depends on them.
type sampler struct {
	db      task.DB
	mu      sync.Mutex
	started bool
	lastID  int64
	lastAt  time.Time // the newest created_at read
	at      time.Time
	buckets map[int64]map[string]*agg
}

func newSampler(db task.DB) *sampler {
	return &sampler{db: db, buckets: map[int64]map[string]*agg{}}
}

// sampleSlack is how much older than the newest audit row read a row
// that commits later may be (its transaction began earlier) and still be
// counted.
const sampleSlack = time.Minute

// refresh reads the audit rows written since the last refresh.
func (s *sampler) refresh(ctx context.Context) error {
	if !s.started {
		id, err := task.AuditWindowStart(ctx, s.db, Window)
		if err != nil {
			return err
		}
		s.lastID = id
		s.started = true
	}
	step := int64(Bucket / time.Second)
	for range maxBatches {
		since := time.Now().Add(-Window)
		if !s.lastAt.IsZero() {
			since = s.lastAt.Add(-sampleSlack)
		}
		samples, err := task.AuditSamples(ctx, s.db, s.lastID, since, sampleBatch, Bucket)
		if err != nil {
			return err
		}
		var seen int64
		for _, x := range samples {
			s.lastID = max(s.lastID, x.MaxID)
			if x.MaxAt.After(s.lastAt) {
				s.lastAt = x.MaxAt
			}
			seen += x.N
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
		if seen < sampleBatch {
			break
		}
	}
	oldest := time.Now().Add(-Window-Bucket).Unix() / step
	for b := range s.buckets {
		if b < oldest {
			delete(s.buckets, b)
		}
	}
	return nil
}

// Series refreshes the samples (at most every sampleEvery) and returns
// the charts.
func (s *sampler) Series(ctx context.Context) (series, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if time.Since(s.at) >= sampleEvery {
		err = s.refresh(ctx)
		if err == nil {
			s.at = time.Now()
		}
	}
	step := int64(Bucket / time.Second)
	n := int(Window / Bucket)
	last := time.Now().Unix() / step
	first := last - int64(n) + 1
	out := series{Start: time.Unix(first*step, 0), Points: make([]agg, n), ByKind: map[string]agg{}}
	for b, byKind := range s.buckets {
		if b < first || b > last {
			continue
		}
		for k, a := range byKind {
			out.Points[b-first].add(*a)
			t := out.ByKind[k]
			t.add(*a)
			out.ByKind[k] = t
			out.Totals.add(*a)
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
