package deploy_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// promtool returns the path of promtool. Without it the test fails: the
// rules would go unchecked.
func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not on PATH (%v): install it with `apt-get install prometheus` (the Debian package ships promtool)", err)
	}
	return path
}

// runPromtool runs promtool with args, reading stdin from in when not nil,
// and fails the test unless it exits 0.
func runPromtool(t *testing.T, in io.Reader, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), args...)
	cmd.Stdin = in
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	runPromtool(t, nil, "check", "rules", "prometheus/alerts.yml")
	runPromtool(t, nil, "test", "rules", "prometheus/alerts_test.yml")
}

func TestPrometheusConfigPassesPromtool(t *testing.T) {
	t.Parallel()
	// Also loads the rule files it names.
	out := runPromtool(t, nil, "check", "config", "prometheus/prometheus.yml")
	if !strings.Contains(out, "alerts.yml") {
		t.Errorf("prometheus.yml does not load alerts.yml; promtool said:\n%s", out)
	}
}

// rule is an alerting rule of a Prometheus rule file.
type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	readYAML(t, "prometheus/alerts.yml", &f)
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("prometheus/alerts.yml has no rules")
	}
	return rules
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// headingAnchor is the anchor a Markdown renderer (GitHub's rules) gives
// a heading.
func headingAnchor(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// Each alert has a severity the routing knows, a summary and description,
// and a runbook_url pointing at its own section of docs/OPERATIONS.md.
func TestEveryAlertLinksItsRunbook(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]string{} // anchor → heading
	for line := range strings.Lines(string(doc)) {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[headingAnchor(h)] = strings.TrimSpace(h)
		}
	}
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			t.Errorf("rule %q is not an alert: alerts.yml holds alerts only", r.Expr)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("%s: two alerts of that name", r.Alert)
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description"} {
			if r.Annotations[a] == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		url := r.Annotations["runbook_url"]
		anchor, ok := strings.CutPrefix(url, "docs/OPERATIONS.md#")
		if !ok {
			t.Errorf("%s: runbook_url %q does not point into docs/OPERATIONS.md", r.Alert, url)
			continue
		}
		if h, ok := anchors[anchor]; !ok || h != r.Alert {
			t.Errorf("%s: runbook_url %q: docs/OPERATIONS.md has no section \"### %s\" with that anchor", r.Alert, url, r.Alert)
		}
	}
}

// alerts_test.yml shows every alert firing at some evaluation and silent
// at another.
func TestEveryAlertHasFiringAndSilentTests(t *testing.T) {
	t.Parallel()
	var f struct {
		Tests []struct {
			Name       string `yaml:"name"`
			AlertTests []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, "prometheus/alerts_test.yml", &f)
	fires, silent := map[string]int{}, map[string]int{}
	for _, tc := range f.Tests {
		for _, at := range tc.AlertTests {
			if len(at.ExpAlerts) > 0 {
				fires[at.Alertname]++
			} else {
				silent[at.Alertname]++
			}
		}
	}
	alerts := map[string]bool{}
	for _, r := range loadRules(t) {
		alerts[r.Alert] = true
		if fires[r.Alert] == 0 {
			t.Errorf("%s: alerts_test.yml never expects it to fire", r.Alert)
		}
		if silent[r.Alert] == 0 {
			t.Errorf("%s: alerts_test.yml never expects it to stay silent", r.Alert)
		}
	}
	for _, tested := range []map[string]int{fires, silent} {
		for name := range tested {
			if !alerts[name] {
				t.Errorf("alerts_test.yml tests %s, which alerts.yml does not define", name)
			}
		}
	}
}
