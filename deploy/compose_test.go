package deploy_test

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ingest-worker/ingest/internal/httpguard"
)

type composeService struct {
	Image       string            `yaml:"image"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
}

// mounts maps a service's container paths to the repository paths bound
// on them (named volumes are left out).
func (s composeService) mounts(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], "./") {
			continue
		}
		local := filepath.Join("..", parts[0])
		if _, err := os.Stat(local); err != nil {
			t.Errorf("volume %q: %v", v, err)
		}
		m[parts[1]] = local
	}
	return m
}

// local returns the repository path a container path is bound to.
func local(t *testing.T, mounts map[string]string, containerPath string) string {
	t.Helper()
	for dst, src := range mounts {
		if rest, ok := strings.CutPrefix(containerPath, dst); ok && (rest == "" || rest[0] == '/') {
			return filepath.Join(src, rest)
		}
	}
	t.Errorf("%s is on no bind mount of the repository (%v)", containerPath, mounts)
	return ""
}

// inDeploy is the path of a file of deploy/ as local returns it.
func inDeploy(path string) string { return filepath.Join("..", "deploy", path) }

// hostPort splits a host:port target, failing the test when it is not one.
func hostPort(t *testing.T, what, hp string) (string, string) {
	t.Helper()
	h, p, err := net.SplitHostPort(hp)
	if err != nil {
		t.Fatalf("%s %q: %v", what, hp, err)
	}
	return h, p
}

// docker-compose.yml runs Prometheus and Grafana on the files of deploy/:
// the bind mounts exist, Prometheus reads the configuration it is given and
// scrapes the worker service's HTTP port, Grafana's data source is the
// prometheus service, and its dashboard provider reads the directory the
// dashboards are mounted on. (No container runs here: this is what can be
// checked without one.)
func TestComposeRunsTheStack(t *testing.T) {
	t.Parallel()
	var compose struct {
		Services map[string]composeService `yaml:"services"`
	}
	readYAML(t, "../docker-compose.yml", &compose)
	for _, name := range []string{"redis", "postgres", "migrate", "worker", "webhook-echo", "prometheus", "grafana"} {
		if _, ok := compose.Services[name]; !ok {
			t.Fatalf("docker-compose.yml has no service %q", name)
		}
	}
	worker, prom, graf := compose.Services["worker"], compose.Services["prometheus"], compose.Services["grafana"]
	for name, s := range map[string]composeService{"prometheus": prom, "grafana": graf} {
		if i := strings.LastIndex(s.Image, ":"); i < 0 || s.Image[i+1:] == "latest" {
			t.Errorf("service %s: image %q has no pinned tag", name, s.Image)
		}
	}

	// Prometheus: its configuration, and the worker it scrapes.
	pm := prom.mounts(t)
	var configFile string
	for _, arg := range prom.Command {
		if v, ok := strings.CutPrefix(arg, "--config.file="); ok {
			configFile = v
		}
	}
	if got := local(t, pm, configFile); got != inDeploy("prometheus/prometheus.yml") {
		t.Errorf("prometheus runs --config.file=%q, which is %q in the repository, want deploy/prometheus/prometheus.yml", configFile, got)
	}
	var promCfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &promCfg)
	if !slices.Contains(promCfg.RuleFiles, "alerts.yml") {
		t.Errorf("prometheus.yml rule_files %v: want alerts.yml", promCfg.RuleFiles)
	}
	_, workerPort := hostPort(t, "worker INGEST_HTTP_ADDR", worker.Environment["INGEST_HTTP_ADDR"])
	var scrapesWorker bool
	for _, sc := range promCfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				h, p := hostPort(t, "scrape target", target)
				scrapesWorker = scrapesWorker || sc.JobName == "ingest-worker" && h == "worker" && p == workerPort
			}
		}
	}
	if !scrapesWorker {
		t.Errorf("prometheus.yml has no job ingest-worker scraping worker:%s (the compose worker's INGEST_HTTP_ADDR)", workerPort)
	}
	// The worker answers only the Host names it knows: the scrape's must be
	// listed (the default list has the container's own name and addresses,
	// not the service's).
	if hosts, err := httpguard.ParseHosts(strings.Split(worker.Environment["INGEST_HTTP_ALLOWED_HOSTS"], ",")); err != nil ||
		!hosts.Allows("worker:"+workerPort) {
		t.Errorf("the worker's INGEST_HTTP_ALLOWED_HOSTS %q (%v) does not allow worker:%s, Prometheus's scrape target: every scrape would get 421",
			worker.Environment["INGEST_HTTP_ALLOWED_HOSTS"], err, workerPort)
	}

	// Grafana: provisioning, data source, dashboards.
	gm := graf.mounts(t)
	if got := local(t, gm, "/etc/grafana/provisioning"); got != inDeploy("grafana/provisioning") {
		t.Errorf("Grafana's provisioning directory is %q, want deploy/grafana/provisioning", got)
	}
	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	readYAML(t, "grafana/provisioning/datasources/prometheus.yml", &ds)
	if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("want one prometheus data source, got %+v", ds.Datasources)
	}
	u, err := url.Parse(ds.Datasources[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	if u.Hostname() != "prometheus" || u.Port() != "9090" {
		t.Errorf("data source URL %s: want the prometheus service on its default port 9090", u)
	}
	var providers struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "grafana/provisioning/dashboards/ingest-worker.yml", &providers)
	if len(providers.Providers) != 1 || providers.Providers[0].Type != "file" {
		t.Fatalf("want one file dashboard provider, got %+v", providers.Providers)
	}
	dir := local(t, gm, providers.Providers[0].Options.Path)
	if _, err := os.Stat(filepath.Join(dir, "ingest-worker.json")); err != nil {
		t.Errorf("the dashboard provider reads %s: %v", providers.Providers[0].Options.Path, err)
	}
	if home := graf.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" {
		if got := local(t, gm, home); got != inDeploy(dashboardPath) {
			t.Errorf("Grafana's home dashboard %s is %q in the repository, want %s", home, got, dashboardPath)
		}
	}
}
