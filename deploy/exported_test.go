package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/stream"
)

// family is what a metric family of the worker exposes: its type (when
// seen on /metrics) and, per label name, the values seen.
type family struct {
	typ    *dto.MetricType
	labels map[string]map[string]bool
}

// exported maps metric family names to what the worker exports.
type exported map[string]*family

func (e exported) add(name string, typ *dto.MetricType) *family {
	f := e[name]
	if f == nil {
		f = &family{labels: map[string]map[string]bool{}}
		e[name] = f
	}
	if typ != nil {
		f.typ = typ
	}
	return f
}

func (f *family) addLabel(name, value string) {
	if f.labels[name] == nil {
		f.labels[name] = map[string]bool{}
	}
	if value != "" {
		f.labels[name][value] = true
	}
}

// lookup finds the family a series name belongs to: the family itself, or
// a histogram's or summary's _bucket, _sum and _count series. extra are
// the labels such a series has beyond the family's (le, quantile).
func (e exported) lookup(name string) (f *family, extra []string) {
	if f := e[name]; f != nil {
		if f.typ != nil && *f.typ == dto.MetricType_SUMMARY {
			return f, []string{"quantile"}
		}
		return f, nil
	}
	for _, s := range []struct {
		suffix string
		types  []dto.MetricType
		extra  []string
	}{
		{"_bucket", []dto.MetricType{dto.MetricType_HISTOGRAM}, []string{"le"}},
		{"_sum", []dto.MetricType{dto.MetricType_HISTOGRAM, dto.MetricType_SUMMARY}, nil},
		{"_count", []dto.MetricType{dto.MetricType_HISTOGRAM, dto.MetricType_SUMMARY}, nil},
	} {
		base, ok := strings.CutSuffix(name, s.suffix)
		if !ok {
			continue
		}
		if f := e[base]; f != nil && f.typ != nil {
			for _, typ := range s.types {
				if *f.typ == typ {
					return f, s.extra
				}
			}
		}
	}
	return nil, nil
}

// exportedMetrics returns what the worker exports: page, the /metrics page
// of a real `ingest-worker run` after it processed tasks of every outcome
// the queries look at, plus the metric families of vectors that show no
// series before their first use (maintenance errors, trimmed entries), read
// from the descriptions of the collectors the same components register.
func exportedMetrics(t *testing.T, page string) exported {
	t.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	e := exported{}
	for name, mf := range families {
		f := e.add(name, mf.Type)
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				f.addLabel(lp.GetName(), lp.GetValue())
			}
		}
	}
	for name, labels := range describedMetrics(t) {
		f := e.add(name, nil)
		for _, l := range labels {
			f.addLabel(l, "")
		}
	}
	return e
}

// buildWorker returns cmd/ingest-worker's binary, built once per test process.
func buildWorker(t *testing.T) string {
	t.Helper()
	return testenv.Binary(t, "github.com/ingest-worker/ingest/cmd/ingest-worker")
}

// webhook answers the worker's webhook calls by task kind: "ok" succeeds,
// "flaky" fails its first attempt (503: retried), "bad" fails for good
// (400: DEAD, into the DLQ).
func webhook(w http.ResponseWriter, r *http.Request) {
	var call struct {
		Kind    string `json:"kind"`
		Attempt int    `json:"attempt"`
	}
	if err := json.NewDecoder(r.Body).Decode(&call); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch {
	case call.Kind == "bad":
		http.Error(w, "rejected for good", http.StatusBadRequest)
	case call.Kind == "flaky" && call.Attempt == 1:
		http.Error(w, "try again", http.StatusServiceUnavailable)
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// scrapeWorker runs `ingest-worker run` against the test's PostgreSQL and
// Redis, creates tasks through its API that succeed, retry and die (into
// the DLQ), leaves entries of a worker gone away for its reclaimer, and
// returns its /metrics page once all of that shows.
func scrapeWorker(t *testing.T) string {
	t.Helper()
	bin := buildWorker(t)
	db := testenv.NewDatabase(t)
	streamKey, dlqKey := testenv.Keys(t)
	hook := httptest.NewServer(http.HandlerFunc(webhook))
	t.Cleanup(hook.Close)

	env := []string{
		"INGEST_DATABASE_URL=" + db.URL,
		"INGEST_REDIS_URL=" + testenv.RedisURL(t),
		"INGEST_REDIS_STREAM_KEY=" + streamKey,
		"INGEST_REDIS_DLQ_STREAM_KEY=" + dlqKey,
		"INGEST_HTTP_ADDR=127.0.0.1:0",
		"INGEST_WEBHOOK_URL=" + hook.URL,
		"INGEST_WORKER_CONCURRENCY=4",
		"INGEST_TASK_LEASE_MS=3000",
		"INGEST_REDIS_RETRY_BASE_BACKOFF_MS=10",
		"INGEST_REDIS_RETRY_MAX_BACKOFF_MS=20",
		"INGEST_REDIS_RECLAIM_INTERVAL_MS=100",
		"INGEST_REDIS_RECLAIM_IDLE_MS=1500",
		"INGEST_SHUTDOWN_TIMEOUT_MS=2000",
		"INGEST_LOG_FORMAT=json",
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "INGEST_") && !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	var logs testenv.Buffer
	cmd := exec.Command(bin, "run")
	cmd.Env, cmd.Stdout, cmd.Stderr = env, &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("ingest-worker run's log:\n%s", logs.String())
		}
	})

	var base string
	testenv.Eventually(t, 30*time.Second, "ingest-worker run to listen", func() bool {
		select {
		case <-done:
			t.Fatalf("ingest-worker run exited: %v\n%s", cmd.ProcessState, logs.String())
		default:
		}
		for line := range strings.Lines(logs.String()) {
			var rec struct {
				Msg  string `json:"msg"`
				HTTP string `json:"http"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "ingest-worker running" && rec.HTTP != "" {
				base = "http://" + rec.HTTP
				return true
			}
		}
		return false
	})

	var okIDs []string
	for kind, n := range map[string]int{"ok": 3, "flaky": 2, "bad": 1} {
		for i := range n {
			body := fmt.Sprintf(`{"kind":%q,"payload":{"n":%d}}`, kind, i)
			resp, err := http.Post(base+"/v1/tasks", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("POST /v1/tasks %s: %s %s", body, resp.Status, b)
			}
			var created struct{ ID string }
			if err := json.Unmarshal(b, &created); err != nil || created.ID == "" {
				t.Fatalf("POST /v1/tasks %s: no task id in %s", body, b)
			}
			if kind == "ok" {
				okIDs = append(okIDs, created.ID)
			}
		}
	}
	orphanEntries(t, streamKey, okIDs)

	// What the queries' label values need to have been seen.
	want := []struct {
		name   string
		labels map[string]string
		least  float64
	}{
		{"ingest_task_process_total", map[string]string{"result": "succeeded"}, 5},
		{"ingest_task_process_total", map[string]string{"result": "retry"}, 2},
		{"ingest_task_process_total", map[string]string{"result": "dead"}, 1},
		{"ingest_task_dlq_total", nil, 1},
		{"ingest_stream_reclaim_total", map[string]string{"result": "claimed"}, 2},
		{"outbox_publish_total", map[string]string{"result": "success"}, 6},
		{"outbox_publish_delay_seconds", nil, 6},
	}
	var page string
	var missing []string
	testenv.Eventually(t, 60*time.Second, "the worker's metrics to show succeeded, retried, reclaimed, dead-lettered and published tasks", func() bool {
		page = get(t, base+"/metrics")
		parser := expfmt.NewTextParser(model.LegacyValidation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(page))
		if err != nil {
			t.Fatalf("parse /metrics: %v", err)
		}
		missing = missing[:0]
		for _, w := range want {
			if v := value(families[w.name], w.labels); v < w.least {
				missing = append(missing, fmt.Sprintf("%s%v = %v (want >= %v)", w.name, w.labels, v, w.least))
			}
		}
		return len(missing) == 0
	})
	return page
}

// orphanEntries leaves entries for the reclaimer to claim, as a worker
// that read them and went away would: an entry per task of taskIDs (each
// task's second), read by a consumer that never settles them, in one
// transaction so that the running worker's reads cannot take them first.
// Once they are idle for INGEST_REDIS_RECLAIM_IDLE_MS, the reclaimer claims
// them and the worker's start settles them.
func orphanEntries(t *testing.T, key string, taskIDs []string) {
	t.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range taskIDs {
			p.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{stream.FieldTaskID, id, stream.FieldKind, "ok"}})
		}
		p.XReadGroup(ctx, &redis.XReadGroupArgs{Group: ingest.DefaultGroup, Consumer: "gone", Streams: []string{key, ">"},
			Count: 100, Block: -1})
		return nil
	})
	if err != nil {
		t.Fatalf("orphan entries: %v", err)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}

// value returns the value of mf's series with labels: a counter's or
// gauge's value, a histogram's sample count (0 when there is none).
func value(mf *dto.MetricFamily, labels map[string]string) float64 {
next:
	for _, m := range mf.GetMetric() {
		for k, v := range labels {
			found := false
			for _, lp := range m.GetLabel() {
				found = found || lp.GetName() == k && lp.GetValue() == v
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return 0
}

// recorder is a prometheus.Registerer that remembers what was registered.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// descPattern reads a metric description's name and label names from
// prometheus.Desc.String (the package exports no accessor for them).
var descPattern = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

// describedMetrics builds the components of a worker process (ingest.Service:
// worker, reclaimer, outbox relay, rescuer, retention) on a fresh registry,
// without running them, and returns the name and label names of every
// metric they describe.
func describedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	db := testenv.NewDatabase(t)
	rdb := testenv.Redis(t)
	streamKey, dlqKey := testenv.Keys(t)
	reg := &recorder{Registerer: prometheus.NewRegistry()}
	if _, err := ingest.NewService(ingest.Config{
		Stream: streamKey, DLQ: dlqKey, Consumer: "describe",
	}, db.Pool, ingest.Redis(rdb), nil, reg); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range reg.collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	out := map[string][]string{}
	for d := range ch {
		m := descPattern.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the metric description %s", d)
		}
		var labels []string
		for _, kv := range regexp.MustCompile(`(\w+)="`).FindAllStringSubmatch(m[2], -1) {
			labels = append(labels, kv[1])
		}
		for l := range strings.SplitSeq(m[3], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				labels = append(labels, l)
			}
		}
		out[m[1]] = labels
	}
	if len(out) == 0 {
		t.Fatal("the worker's components describe no metrics")
	}
	return out
}
