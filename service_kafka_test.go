package ingest_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/maintenance"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/task"
)

// TestKafkaUnreachableBrokerThenRedrive is the seed's reproduction 5.2 as
// a script: the brokers are at a port nothing listens on. Tasks are
// created and stay QUEUED; their outbox rows go RETRYING with backoff, then
// DEAD with next_retry_at NULL (the seed's outbox_event query shows it).
// Once a broker listens there, redrive publishes them again and they run.
func TestKafkaUnreachableBrokerThenRedrive(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{Stream: kafka.DefaultTopic}, db)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecorder{}
	t.Cleanup(func() {
		if t.Failed() {
			logs.dump(t)
		}
	})
	const maxAttempts = 5
	kcfg := kafka.Config{Brokers: []string{"127.0.0.1:" + strconv.Itoa(port)}, ProduceTimeout: 300 * time.Millisecond,
		CommitInterval: 20 * time.Millisecond}
	var mu sync.Mutex
	ran := map[uuid.UUID]int{}
	reg := prometheus.NewRegistry()
	svc, err := ingest.NewService(ingest.Config{
		Store:    store.Config(),
		Consumer: "w-5-2", TaskLease: time.Second,
		Relay: outbox.RelayConfig{MaxAttempts: maxAttempts, PublishInterval: 20 * time.Millisecond, PublishTimeout: time.Second,
			Backoff: backoff.Policy{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond}},
	}, db, ingest.Kafka(kcfg), slog.New(logs), reg)
	if err != nil {
		t.Fatal(err)
	}
	svc.Handle("k", func(_ context.Context, tk ingest.Task) error {
		mu.Lock()
		ran[tk.ID]++
		mu.Unlock()
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	kb := &kbundle{t: t, ctx: context.Background(), db: db, store: store}
	ids := kb.enqueue("k", 3, 0)
	// The seed's query, as an operator runs it.
	type row struct {
		status      string
		attempts    int
		nextRetryAt *time.Time
		lastError   string
		sentAt      *time.Time
	}
	seedQuery := func() []row {
		rows, err := db.Query(kb.ctx, `SELECT id,status,attempt_count,next_retry_at,last_error,created_at,sent_at FROM outbox_event ORDER BY created_at DESC LIMIT 20`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []row
		for rows.Next() {
			var r row
			var id int64
			var lastErr *string
			var created time.Time
			if err := rows.Scan(&id, &r.status, &r.attempts, &r.nextRetryAt, &lastErr, &created, &r.sentAt); err != nil {
				t.Fatal(err)
			}
			if lastErr != nil {
				r.lastError = *lastErr
			}
			out = append(out, r)
		}
		return out
	}
	sawRetrying := false
	testenv.Eventually(t, 30*time.Second, "3 outbox rows DEAD", func() bool {
		dead := 0
		for _, r := range seedQuery() {
			switch r.status {
			case "RETRYING":
				sawRetrying = sawRetrying || (r.nextRetryAt != nil && r.lastError != "")
			case "DEAD":
				if r.attempts != maxAttempts || r.nextRetryAt != nil || r.lastError == "" || r.sentAt != nil {
					t.Fatalf("DEAD outbox row %+v: want attempt_count %d, next_retry_at NULL, last_error set, no sent_at", r, maxAttempts)
				}
				dead++
			}
		}
		return dead == 3
	})
	if !sawRetrying {
		t.Error("no outbox row was seen RETRYING with next_retry_at and last_error before DEAD")
	}
	for _, id := range ids {
		if s := kb.task(id).Status; s != task.Queued {
			t.Errorf("task %s is %s, want QUEUED while the broker is unreachable", id, s)
		}
	}
	awaitMetric(t, reg, "outbox_publish_total", map[string]string{"result": "dead"}, 3)

	// The broker comes back at the configured address; redrive publishes
	// the tasks again.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.SeedTopics(2, kafka.DefaultTopic, kafka.DefaultDLQTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	res, err := store.Redrive(kb.ctx, "test", ids...)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if !r.Applied || r.Status != task.Queued {
			t.Errorf("redrive of %s: %+v, want applied and QUEUED", r.ID, r)
		}
	}
	testenv.Eventually(t, 30*time.Second, "3 SUCCEEDED", func() bool { return kb.countStatus(task.Succeeded) == 3 })
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if ran[id] != 1 {
			t.Errorf("task %s ran %d times, want 1", id, ran[id])
		}
	}
}

// TestKafkaServiceKeepsItsConfig: a Kafka-mode service reports the
// configuration it runs with (Service.Config), the queue's identity taken
// from the Kafka configuration, and the maintenance settings it is given
// (the releaser, Listen, retention) reach its maintainer, while the
// services of Redis mode (reclaimer, rescuer, idle-consumer cleanup,
// stream trimming) are off.
func TestKafkaServiceKeepsItsConfig(t *testing.T) {
	t.Parallel()
	db := testenv.NewDatabase(t).Pool
	listen := pgsession.Source{None: true}
	cfg := ingest.Config{
		Consumer: "k-1", Concurrency: 3, TaskLease: 2 * time.Second, Listen: listen,
		Maintenance: maintenance.Config{
			Releaser:         maintenance.ReleaserConfig{Interval: 7 * time.Second},
			ReleaserDisabled: false,
			Retention:        maintenance.RetentionConfig{BatchSize: 5, Interval: 11 * time.Second},
		},
	}
	kcfg := kafka.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "tasks-k", Group: "group-k"}
	svc, err := ingest.NewService(cfg, db, ingest.Kafka(kcfg), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := svc.Config()
	if got.Consumer != "k-1" || got.Concurrency != 3 || got.TaskLease != 2*time.Second || got.Stream != "tasks-k" || got.Group != "group-k" ||
		got.Store.Stream != "tasks-k" || got.Relay.ID != "k-1" || got.Listen != listen || !got.ReclaimDisabled {
		t.Fatalf("Service.Config() = %+v; want the configuration given, on topic tasks-k of group group-k", got)
	}
	m := svc.Maintainer().Config()
	if m.Releaser.Interval != 7*time.Second || m.ReleaserDisabled || m.Listen != listen ||
		m.Retention.BatchSize != 5 || m.Retention.Interval != 11*time.Second || m.Elector.ID != "k-1" {
		t.Errorf("maintainer config %+v: the releaser, Listen, retention or elector settings given were dropped", m)
	}
	if !m.RescuerDisabled || !m.ConsumersDisabled || !m.Retention.DisableTrim || m.Retention.DLQ != "" ||
		len(m.Retention.Streams) != 1 || m.Retention.Streams[0] != "tasks-k" {
		t.Errorf("maintainer config %+v: want no rescuer, no consumer cleanup, no trimming and no DLQ stream in Kafka mode", m)
	}
}
