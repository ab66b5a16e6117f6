package maintenance_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/maintenance"
)

func TestConfigValidationNamesTheField(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		cfg   maintenance.Config
		field string // "" for valid
	}{
		{"Defaults", maintenance.Config{}, ""},
		{"RescuerBatchSize", maintenance.Config{Rescuer: maintenance.RescuerConfig{BatchSize: -1}}, "Rescuer.BatchSize"},
		{"RescuerGrace", maintenance.Config{Rescuer: maintenance.RescuerConfig{Grace: -time.Second}}, "Rescuer.Grace"},
		{"RescuerDisabledIsNotChecked", maintenance.Config{Rescuer: maintenance.RescuerConfig{Grace: -time.Second}, RescuerDisabled: true}, ""},
		{"RetentionStreams", maintenance.Config{Retention: maintenance.RetentionConfig{Streams: []string{"a", ""}}}, "Retention.Streams[1]"},
		{"RetentionBatchSize", maintenance.Config{Retention: maintenance.RetentionConfig{BatchSize: -1}}, "Retention.BatchSize"},
		{"PartitionsKeepMax", maintenance.Config{Partitions: maintenance.PartitionsConfig{KeepMax: -1}}, "Partitions.KeepMax"},
		{"ConsumerIdleTimeoutNegative", maintenance.Config{Consumers: maintenance.ConsumersConfig{IdleTimeout: -time.Hour}}, "Consumers.IdleTimeout"},
		{"ConsumerCheckIntervalNegative", maintenance.Config{Consumers: maintenance.ConsumersConfig{Interval: -1}}, "Consumers.Interval"},
		{"TTLTooShort", maintenance.Config{Elector: maintenance.ElectorConfig{TTL: time.Millisecond}}, "Elector.TTL"},
		{"MarginNotBelowTTL", maintenance.Config{Elector: maintenance.ElectorConfig{TTL: time.Second, Margin: time.Second}}, "Elector.Margin"},
		{"RenewAfterDeadline", maintenance.Config{Elector: maintenance.ElectorConfig{TTL: 3 * time.Second, RenewInterval: 2 * time.Second}}, "Elector.RenewInterval"},
		{"RetryIntervalNegative", maintenance.Config{Elector: maintenance.ElectorConfig{RetryInterval: -time.Second}}, "Elector.RetryInterval"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			switch {
			case c.field == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case c.field != "" && (!errors.Is(err, maintenance.ErrConfig) || !strings.HasPrefix(err.Error(), "maintenance: "+c.field+": ")):
				t.Fatalf("Validate = %v; want a maintenance.ErrConfig naming %s", err, c.field)
			}
		})
	}
}

func TestNewDefaultsAndRequirements(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	if _, err := maintenance.New(maintenance.Config{}, nil, rdb, nil, nil); !errors.Is(err, maintenance.ErrConfig) || !strings.Contains(err.Error(), "pool") {
		t.Errorf("New without a pool = %v, want an error naming the pool", err)
	}
	if _, err := maintenance.New(maintenance.Config{}, db, nil, nil, nil); !errors.Is(err, maintenance.ErrConfig) || !strings.Contains(err.Error(), "rdb") {
		t.Errorf("New without Redis = %v, want an error naming rdb", err)
	}
	noRedis := maintenance.Config{RescuerDisabled: true, ConsumersDisabled: true, Retention: maintenance.RetentionConfig{DisableTrim: true}}
	if _, err := maintenance.New(noRedis, db, nil, nil, nil); err != nil {
		t.Errorf("New without Redis when no service uses it = %v, want nil", err)
	}

	m, err := maintenance.New(maintenance.Config{}, db, rdb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := m.Config()
	e := got.Elector
	if e.Name != "maintenance" || e.ID == "" || e.TTL != 3*time.Second || e.RenewInterval != time.Second ||
		e.RetryInterval != time.Second || e.Margin != time.Second {
		t.Errorf("elector defaults %+v", e)
	}
	if r := got.Rescuer; r.Stream != "ingest:tasks" || r.Group != "ingest-workers" || r.Interval != 30*time.Second ||
		r.BatchSize != 100 || r.PagesPerRun != 10 || r.Grace != time.Minute {
		t.Errorf("rescuer defaults %+v", r)
	}
	if r := got.Retention; r.Interval != time.Minute || r.BatchSize != 1000 ||
		len(r.Streams) != 1 || r.Streams[0] != "ingest:tasks" {
		t.Errorf("retention defaults %+v", r)
	}
	if c := got.Consumers; c.Stream != "ingest:tasks" || c.Group != "ingest-workers" || c.IdleTimeout != time.Hour || c.Interval != time.Minute {
		t.Errorf("consumer cleanup defaults %+v", c)
	}
	if got, want := maintenance.Services(m), []string{"rescuer", "retention", "partitions", "low_water", "releaser", "sequences", "consumers"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("services %v, want %v", got, want)
	}
	two, err := maintenance.New(maintenance.Config{}, db, rdb, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if maintenance.LeaderID(m) == maintenance.LeaderID(two) {
		t.Errorf("two maintainers of one process share leader id %q", maintenance.LeaderID(m))
	}
}

// TestMetricsShared: two maintainers on one registry share their metrics
// (as the rescuers and retentions of one process did), and the leader
// gauge starts at 0.
func TestMetricsShared(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := maintenance.New(maintenance.Config{}, db, rdb, nil, reg); err != nil {
			t.Fatalf("New on a shared registry: %v", err)
		}
	}
	if v := metricValue(t, reg, "ingest_leader", "name", "maintenance"); v != 0 {
		t.Errorf("ingest_leader{name=maintenance} = %v, want 0", v)
	}
	if v := metricValue(t, reg, "ingest_stream_reclaim_total", "result", "error"); v != 0 {
		t.Errorf("ingest_stream_reclaim_total{result=error} = %v, want 0 (registered, none yet)", v)
	}
}
