package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

const dashboardPath = "grafana/dashboards/ingest-worker.json"

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	GridPos    struct {
		H int `json:"h"`
		W int `json:"w"`
		X int `json:"x"`
		Y int `json:"y"`
	} `json:"gridPos"`
	Targets []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels returns the dashboard's panels, those of collapsed rows too.
func (d dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// The dashboard is well formed: unique panel ids, panels that do not
// overlap, every query panel with queries on the data source variable.
func TestDashboardStructure(t *testing.T) {
	t.Parallel()
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q: both must be set", d.UID, d.Title)
	}
	const ds = "${datasource}"
	var dsVar bool
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && string(v.Query) == `"prometheus"` {
			dsVar = true
		}
	}
	if !dsVar {
		t.Error(`no data source variable "datasource" of type prometheus`)
	}
	ids := map[int]string{}
	var placed []panel
	for _, p := range d.allPanels() {
		if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share the id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v is outside the 24-column grid", p.Title, p.GridPos)
		}
		for _, q := range placed {
			a, b := p.GridPos, q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q and %q overlap", p.Title, q.Title)
			}
		}
		placed = append(placed, p)
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != ds {
			t.Errorf("panel %q: data source %+v, want uid %s", p.Title, p.Datasource, ds)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q, query %s: empty expression", p.Title, q.RefID)
			}
			if q.Datasource == nil || q.Datasource.UID != ds {
				t.Errorf("panel %q, query %s: data source %+v, want uid %s", p.Title, q.RefID, q.Datasource, ds)
			}
		}
	}
}

// query is a PromQL expression and where it comes from.
type query struct {
	where, expr string
}

// grafanaRanges are Grafana's range variables; the check parses them as 5m.
var grafanaRanges = regexp.MustCompile(`\$__(rate_interval|interval|range)\b|\$\{__(rate_interval|interval|range)\}`)

// labelValues is Grafana's label_values(selector, label) variable query.
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// dashboardQueries returns the dashboard's panel queries and the selectors
// of its label_values variables; label_values adds the label as a
// "by" aggregation so its existence is checked too.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	d := loadDashboard(t)
	var qs []query
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("dashboard panel %q query %s", p.Title, tg.RefID), tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("dashboard variable %s: query %q is not label_values(selector, label)", v.Name, v.Definition)
			continue
		}
		qs = append(qs, query{fmt.Sprintf("dashboard variable %s", v.Name), fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
	}
	if len(qs) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return qs
}

func alertQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, r := range loadRules(t) {
		qs = append(qs, query{"alert " + r.Alert, r.Expr})
	}
	return qs
}

// scrapeJobs returns the job names of prometheus.yml's scrape configs.
func scrapeJobs(t *testing.T) []string {
	t.Helper()
	var cfg struct {
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &cfg)
	var jobs []string
	for _, sc := range cfg.ScrapeConfigs {
		jobs = append(jobs, sc.JobName)
	}
	return jobs
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = map[string]bool{"job": true, "instance": true}

// checker checks PromQL expressions against what the worker exports.
type checker struct {
	exported exported
	jobs     []string // scrape jobs of prometheus.yml
}

// check returns the problems of one expression: a metric the worker does
// not export, a label its series do not have, a label value none of them
// has, an aggregation by a label none of its operands has.
func (c checker) check(q query) []string {
	expr, err := parser.ParseExpr(grafanaRanges.ReplaceAllString(q.expr, "5m"))
	if err != nil {
		return []string{fmt.Sprintf("%s: %v", q.where, err)}
	}
	var problems []string
	bad := func(format string, args ...any) {
		problems = append(problems, q.where+": "+fmt.Sprintf(format, args...))
	}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			c.checkSelector(n, bad)
		case *parser.AggregateExpr:
			if n.Without {
				break
			}
			have := c.labelsOf(n.Expr)
			for _, l := range n.Grouping {
				if !have[l] {
					bad("%s aggregates by %q, a label none of its series has", n.Op, l)
				}
			}
		}
		return nil
	})
	return problems
}

func (c checker) checkSelector(n *parser.VectorSelector, bad func(string, ...any)) {
	if n.Name == "" {
		bad("selector %s names no metric", n)
		return
	}
	if n.Name == "up" {
		// Prometheus's own series of each target: of the worker's job.
		for _, m := range n.LabelMatchers {
			if m.Name == "job" && (strings.Contains(m.Value, "$") || slices.ContainsFunc(c.jobs, m.Matches)) {
				return
			}
		}
		bad("%s: up must select a scrape job of prometheus.yml (%v) or $job", n, c.jobs)
		return
	}
	f, extra := c.exported.lookup(n.Name)
	if f == nil {
		bad("%s: the worker exports no metric %s", n, n.Name)
		return
	}
	for _, m := range n.LabelMatchers {
		if m.Name == model.MetricNameLabel || targetLabels[m.Name] || slices.Contains(extra, m.Name) {
			continue
		}
		values, ok := f.labels[m.Name]
		if !ok {
			bad("%s: %s has no label %q", n, n.Name, m.Name)
			continue
		}
		if strings.Contains(m.Value, "$") || len(values) == 0 ||
			(m.Type != labels.MatchEqual && m.Type != labels.MatchRegexp) {
			continue
		}
		matched := false
		for v := range values {
			matched = matched || m.Matches(v)
		}
		if !matched {
			bad("%s: no series of %s has %s (seen: %v)", n, n.Name, m, keys(values))
		}
	}
}

// labelsOf returns the label names the series of expr can have.
func (c checker) labelsOf(expr parser.Expr) map[string]bool {
	have := map[string]bool{}
	for l := range targetLabels {
		have[l] = true
	}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if n, ok := node.(*parser.VectorSelector); ok {
			if f, extra := c.exported.lookup(n.Name); f != nil {
				for l := range f.labels {
					have[l] = true
				}
				for _, l := range extra {
					have[l] = true
				}
			}
		}
		return nil
	})
	return have
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// A running worker's /metrics passes promtool check metrics, and every
// PromQL expression of the dashboard and the alert rules names only
// metrics, labels and label values it exports.
func TestQueriesUseExportedMetrics(t *testing.T) {
	t.Parallel()
	page := scrapeWorker(t)
	t.Run("MetricsPagePassesPromtool", func(t *testing.T) {
		if out := runPromtool(t, strings.NewReader(page), "check", "metrics"); strings.TrimSpace(out) != "" {
			t.Errorf("promtool check metrics reports problems with the worker's /metrics:\n%s", out)
		}
	})
	c := checker{exported: exportedMetrics(t, page), jobs: scrapeJobs(t)}
	for _, set := range []struct {
		name    string
		queries []query
	}{
		{"Dashboard", dashboardQueries(t)},
		{"AlertRules", alertQueries(t)},
	} {
		t.Run(set.name, func(t *testing.T) {
			for _, q := range set.queries {
				for _, p := range c.check(q) {
					t.Error(p)
				}
			}
		})
	}
}

// The checker itself finds what it is there to find.
func TestCheckerFindsUnknownNames(t *testing.T) {
	t.Parallel()
	counter := exported{}
	f := counter.add("ingest_task_process_total", nil)
	f.addLabel("result", "succeeded")
	f.addLabel("result", "retry")
	c := checker{exported: counter, jobs: []string{"ingest-worker"}}
	for _, tc := range []struct {
		expr string
		ok   bool
	}{
		{`sum by (result) (rate(ingest_task_process_total{result=~"retry|dead", instance=~"$instance"}[$__rate_interval]))`, true},
		{`up{job="ingest-worker"} == 0`, true},
		{`up{job="$job"}`, true},
		{`rate(ingest_task_processed_total[5m])`, false},       // no such metric
		{`ingest_task_process_total{reslt="retry"}`, false},    // no such label
		{`ingest_task_process_total{result="retried"}`, false}, // no such value
		{`ingest_task_process_total{result=~"x|y"}`, false},    // no value matches
		{`sum by (kind) (ingest_task_process_total)`, false},   // no such label to aggregate by
		{`up{job="worker"}`, false},                            // not a scrape job
		{`rate(ingest_task_process_total[5m]`, false},          // does not parse
	} {
		problems := c.check(query{"test", tc.expr})
		if ok := len(problems) == 0; ok != tc.ok {
			t.Errorf("%s: problems %q, want ok=%v", tc.expr, problems, tc.ok)
		}
	}
}
