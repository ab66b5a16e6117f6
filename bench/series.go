package bench

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/task"
)

// Tables are the tables whose row versions, sizes and vacuum activity a
// series samples.
var Tables = []string{"ingest_task", "outbox_row", "outbox_log", "ingest_task_transition"}

// Sample is one period of a run's series (Options.Sample): what the path
// did in the period and the state of the database at its end.
type Sample struct {
	// At is the end of the period, in seconds from the run's start.
	At float64 `json:"at_s"`
	// Held: the transactions of Options.Hold were open for all or part
	// of the period.
	Held bool `json:"held"`
	// Inserted and Succeeded count the tasks so far; TasksPerSecond is
	// those SUCCEEDED in the period, per second.
	Inserted       int64   `json:"inserted"`
	Succeeded      int64   `json:"succeeded"`
	TasksPerSecond float64 `json:"tasks_per_second"`
	// StartMS is commit → handler start of the tasks started in the
	// period.
	StartMS Percentiles `json:"start_ms"`
	// RescuePageMS is the time of the rescuer's pages
	// (task.RescueCandidates, the rescuer's page size, every class)
	// that a probe ran in the period, see RescueProbe.
	RescuePageMS Percentiles `json:"rescue_page_ms"`
	// Tables: per table of Tables, from pg_stat_user_tables and the
	// size functions (statistics lag the period by up to a second or
	// so: PostgreSQL's statistics are flushed that often).
	Tables map[string]TableSample `json:"tables"`
	// Statements are the statements of the path (and of its maintainer:
	// relay, rescuer, retention) that took the most time in the period,
	// as the client saw them, slowest total first (at most 12).
	Statements []StatementTime `json:"statements"`
	// RetentionDeleted is the tasks retention deleted in the period
	// (ingest_task_retention_deleted_total), RetentionPerSecond the same
	// per second.
	RetentionDeleted   int64   `json:"retention_deleted"`
	RetentionPerSecond float64 `json:"retention_per_second"`
	// Deletes are the statements of the period that deleted rows
	// (retention's: expired tasks with their audit and outbox rows, a
	// batch a statement, and SENT outbox rows), with their mean time.
	Deletes StatementTime `json:"deletes"`
	// RSSMiB is this process's resident set at the end of the period.
	RSSMiB float64 `json:"rss_mib"`
	// HTTPMS, with Options.Soak, times one request of each of the
	// routes in SoakRoutes, made in the process at the end of the period
	// (the handlers the binary serves, on the database of the run).
	HTTPMS map[string]float64 `json:"http_ms,omitempty"`
}

// TableSample is one table at the end of a period.
type TableSample struct {
	LiveTuples int64 `json:"live_tuples"`
	DeadTuples int64 `json:"dead_tuples"`
	// Autovacuums and Autoanalyzes count since the statistics were
	// reset (the server's start for a throwaway one).
	Autovacuums  int64 `json:"autovacuums"`
	Autoanalyzes int64 `json:"autoanalyzes"`
	// TotalBytes is pg_total_relation_size (heap, indexes, TOAST);
	// IndexBytes each index's pg_relation_size.
	TotalBytes int64            `json:"total_bytes"`
	IndexBytes map[string]int64 `json:"index_bytes"`
}

// StatementTime is one statement's share of a period.
type StatementTime struct {
	Statement string  `json:"statement"`
	Count     int64   `json:"count"`
	MeanMS    float64 `json:"mean_ms"`
	TotalMS   float64 `json:"total_ms"`
}

// SoakRoutes are the routes a soak's samples time: the dashboard's
// overview and task list, the API's task list and the /metrics scrape
// (whose collectors read the queue depths: outbox backlog, stream length
// and pending entries, waiting tasks of limited kinds).
var SoakRoutes = []string{"GET /ui/", "GET /ui/tasks", "GET /v1/tasks", "GET /metrics"}

// tableStatsSQL and indexSizesSQL read each table of $1 whole: a
// partitioned one (the audit table) as the sum of its partitions, each
// partition's index under the partitioned index it belongs to
// (pg_partition_tree lists no plain table, hence the UNION).
const tableStatsSQL = `
SELECT r.name, sum(s.n_live_tup)::bigint, sum(s.n_dead_tup)::bigint, sum(s.autovacuum_count)::bigint, sum(s.autoanalyze_count)::bigint,
       CASE WHEN $2 THEN sum(pg_total_relation_size(s.relid))::bigint ELSE 0 END
FROM unnest($1::text[]) AS r(name)
CROSS JOIN LATERAL (SELECT relid FROM pg_partition_tree(to_regclass(r.name)) UNION SELECT to_regclass(r.name)) p
JOIN pg_stat_user_tables s ON s.relid = p.relid
GROUP BY r.name`

const indexSizesSQL = `
SELECT r.name, coalesce(pi.relname, i.indexrelname), sum(pg_relation_size(i.indexrelid))::bigint
FROM unnest($1::text[]) AS r(name)
CROSS JOIN LATERAL (SELECT relid FROM pg_partition_tree(to_regclass(r.name)) UNION SELECT to_regclass(r.name)) p
JOIN pg_stat_user_indexes i ON i.relid = p.relid
LEFT JOIN pg_inherits h ON h.inhrelid = i.indexrelid
LEFT JOIN pg_class pi ON pi.oid = h.inhparent
GROUP BY 1, 2`

// readTables reads the statistics of Tables, with their sizes when sizes
// is set.
func readTables(ctx context.Context, db task.DB, sizes bool) (map[string]TableSample, error) {
	out := map[string]TableSample{}
	rows, err := db.Query(ctx, tableStatsSQL, Tables, sizes)
	if err != nil {
		return nil, fmt.Errorf("read table statistics: %w", err)
	}
	var name string
	var t TableSample
	if _, err := pgx.ForEachRow(rows, []any{&name, &t.LiveTuples, &t.DeadTuples, &t.Autovacuums, &t.Autoanalyzes, &t.TotalBytes}, func() error {
		out[name] = t
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read table statistics: %w", err)
	}
	if !sizes {
		return out, nil
	}
	rows, err = db.Query(ctx, indexSizesSQL, Tables)
	if err != nil {
		return nil, fmt.Errorf("read index sizes: %w", err)
	}
	var index string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &index, &n}, func() error {
		t := out[name]
		if t.IndexBytes == nil {
			t.IndexBytes = map[string]int64{}
		}
		t.IndexBytes[index] = n
		out[name] = t
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read index sizes: %w", err)
	}
	return out, nil
}

// RescueProbe times the rescuer's pages: every Every it walks each class
// of task.RescueClasses as one rescuer pass does (up to PagesPerRun pages
// of BatchSize tasks, going on where the previous walk stopped), with
// task.RescueCandidates, the statement the rescuer runs, read-only. The
// rescuer itself does not time its pages; the probe runs the same
// statement with the rescuer's default page size and grace.
type RescueProbe struct {
	DB          task.DB
	Every       time.Duration
	BatchSize   int
	PagesPerRun int

	mu      sync.Mutex
	window  *histogram
	cursors map[task.RescueClass]task.RescueCursor
}

// NewRescueProbe returns a probe with the rescuer's default page size and
// pages per pass, walking every second.
func NewRescueProbe(db task.DB) *RescueProbe {
	return &RescueProbe{DB: db, Every: time.Second, BatchSize: maintenance.DefaultRescueBatchSize,
		PagesPerRun: maintenance.DefaultRescuePagesPerRun, window: new(histogram),
		cursors: map[task.RescueClass]task.RescueCursor{}}
}

// Run walks until ctx is done.
func (p *RescueProbe) Run(ctx context.Context) {
	t := time.NewTicker(p.Every)
	defer t.Stop()
	for {
		p.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *RescueProbe) pass(ctx context.Context) {
	for _, class := range task.RescueClasses {
		for range p.PagesPerRun {
			t0 := time.Now()
			page, err := task.RescueCandidates(ctx, p.DB, class, p.cursors[class], p.BatchSize, maintenance.DefaultRescueGrace)
			if err != nil {
				return // ctx done, or the server unreachable: the period shows fewer pages
			}
			p.mu.Lock()
			p.window.record(time.Since(t0))
			p.mu.Unlock()
			p.cursors[class] = page.Next
			if !page.More {
				delete(p.cursors, class)
				break
			}
		}
	}
}

// Take returns the page times recorded since the previous call.
func (p *RescueProbe) Take() Percentiles { return p.take().percentiles() }

func (p *RescueProbe) take() *histogram {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.window
	p.window = new(histogram)
	return h
}

// soakHTTP serves SoakRoutes in the process.
type soakHTTP struct {
	handlers map[string]http.Handler // route → handler
}

func (s *soakHTTP) time(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	for _, route := range SoakRoutes {
		method, path, _ := cutSpace(route)
		req := httptest.NewRequestWithContext(ctx, method, path, nil)
		rec := httptest.NewRecorder()
		t0 := time.Now()
		s.handlers[route].ServeHTTP(rec, req)
		ms := float64(time.Since(t0).Microseconds()) / 1000
		if rec.Code != http.StatusOK {
			ms = -float64(rec.Code) // a failed request shows as its negated status
		}
		out[route] = ms
	}
	return out
}

func cutSpace(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// retentionDeleted sums ingest_task_retention_deleted_total in g.
func retentionDeleted(g prometheus.Gatherer) int64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "ingest_task_retention_deleted_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return int64(n)
}

// topStatements returns the n statements of d that took the most time.
func topStatements(d Snapshot, n int) []StatementTime {
	var l []StatementTime
	for k, t := range d.Timed {
		if t.N <= 0 {
			continue
		}
		l = append(l, StatementTime{Statement: k, Count: t.N, TotalMS: ms(t.D), MeanMS: ms(t.D) / float64(t.N)})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].TotalMS > l[j].TotalMS })
	if len(l) > n {
		l = l[:n]
	}
	return l
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// seriesHeader and row are the CSV form of samples (Options.SeriesOut).
func seriesHeader(soak bool) []string {
	h := []string{"at_s", "held", "inserted", "succeeded", "tasks_per_s", "start_p50_ms", "start_p99_ms",
		"rescue_pages", "rescue_page_p50_ms", "rescue_page_p99_ms", "rescue_page_max_ms"}
	for _, t := range Tables {
		h = append(h, t+"_live", t+"_dead", t+"_autovacuums")
		if soak {
			h = append(h, t+"_bytes", t+"_index_bytes")
		}
	}
	h = append(h, "retention_deleted_per_s", "delete_statements", "delete_statement_mean_ms", "rss_mib")
	if soak {
		for _, r := range SoakRoutes {
			h = append(h, r+" ms")
		}
	}
	return append(h, "slowest_statement", "slowest_statement_mean_ms")
}

func (s Sample) row(soak bool) []string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	r := []string{f(s.At), strconv.FormatBool(s.Held), i(s.Inserted), i(s.Succeeded), f(s.TasksPerSecond),
		f(s.StartMS.P50), f(s.StartMS.P99), i(s.RescuePageMS.Count), f(s.RescuePageMS.P50), f(s.RescuePageMS.P99), f(s.RescuePageMS.Max)}
	for _, name := range Tables {
		t := s.Tables[name]
		r = append(r, i(t.LiveTuples), i(t.DeadTuples), i(t.Autovacuums))
		if soak {
			var idx int64
			for _, n := range t.IndexBytes {
				idx += n
			}
			r = append(r, i(t.TotalBytes), i(idx))
		}
	}
	r = append(r, f(s.RetentionPerSecond), i(s.Deletes.Count), f(s.Deletes.MeanMS), f(s.RSSMiB))
	if soak {
		for _, route := range SoakRoutes {
			r = append(r, f(s.HTTPMS[route]))
		}
	}
	if len(s.Statements) > 0 {
		return append(r, s.Statements[0].Statement, f(s.Statements[0].MeanMS))
	}
	return append(r, "", "")
}

// seriesWriter writes samples as CSV rows as they come.
type seriesWriter struct {
	w    *csv.Writer
	soak bool
}

func newSeriesWriter(w io.Writer, soak bool) *seriesWriter {
	if w == nil {
		return nil
	}
	s := &seriesWriter{w: csv.NewWriter(w), soak: soak}
	_ = s.w.Write(seriesHeader(soak))
	s.w.Flush()
	return s
}

func (s *seriesWriter) write(smp Sample) {
	if s == nil {
		return
	}
	_ = s.w.Write(smp.row(s.soak))
	s.w.Flush()
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}
