package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/dlq"
	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/redact"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/migrations"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

// kafkaConfig is the Kafka clients' configuration (INGEST_QUEUE=kafka).
func (c *Config) kafkaConfig() kafka.Config {
	return kafka.Config{Brokers: c.kafkaBrokers(), Topic: c.KafkaTopic, Group: c.KafkaGroup,
		DLQTopic: c.KafkaDLQTopic, NoDLQ: c.KafkaDLQTopic == "", ClientID: c.ConsumerName}
}

// kafkaBrokers splits KAFKA_BOOTSTRAP_SERVERS.
func (c *Config) kafkaBrokers() []string {
	var out []string
	for _, b := range strings.Split(c.KafkaBrokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// kafkaBackoff is the retry policy of failed runs and failed publishes in
// Kafka mode (INGEST_KAFKA_RETRY_BASE_BACKOFF_MS, _MAX_).
func (c *Config) kafkaBackoff() backoff.Policy {
	return backoff.Policy{Base: c.KafkaRetryBaseBackoff, Max: c.KafkaRetryMaxBackoff, Jitter: backoff.DefaultJitter}
}

// kafkaMode is the Kafka queue mode (INGEST_QUEUE=kafka): a Kafka
// consumer group carries the tasks; Redis is not used.
type kafkaMode struct{ a *app }

func (m kafkaMode) service(ctx context.Context, pool *pgxpool.Pool, _ redis.UniversalClient, opts ...kgo.Opt) (ingest.Config, ingest.Queue, error) {
	c := m.a.cfg
	if err := migrations.Check(ctx, pool); err != nil {
		return ingest.Config{}, nil, fmt.Errorf("schema check: %w", err)
	}
	return ingest.Config{
		Store: m.storeConfig(),
		Relay: outbox.RelayConfig{
			BatchSize: c.KafkaPublishBatchSize, PublishInterval: c.KafkaPublishInterval,
			MaxAttempts: c.KafkaMaxAttempts, Backoff: c.kafkaBackoff(),
		},
	}, ingest.Kafka(c.kafkaConfig(), opts...), nil
}

// storeConfig: new tasks' outbox rows go to the task topic.
func (m kafkaMode) storeConfig() task.Config {
	c := m.a.cfg
	return task.Config{
		Stream:          c.KafkaTopic,
		MaxAttempts:     c.KafkaMaxAttempts,
		MaxPayloadBytes: c.MaxPayloadBytes,
		MaxResultBytes:  c.MaxResultBytes,
		Backoff:         c.kafkaBackoff(),
		Keyring:         c.Keyring,
	}
}

// openServers connects to PostgreSQL only: rdb is nil.
func (m kafkaMode) openServers(ctx context.Context) (*pgxpool.Pool, redis.UniversalClient, func(), error) {
	pool, err := m.a.openDB(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return pool, nil, pool.Close, nil
}

// dlqStream: the DLQ topic's records are not removed.
func (m kafkaMode) dlqStream() string { return "" }

func (m kafkaMode) runAttrs() []any {
	a, c := m.a, m.a.cfg
	return []any{"consumer", c.ConsumerName, "queue", queueKafka, "topic", c.KafkaTopic, "group", c.KafkaGroup,
		"concurrency", c.WorkerConcurrency, "kafka", c.KafkaBrokers, "database", a.dbShown()}
}

// pending prints the group's lag per partition of the task topic.
func (m kafkaMode) pending(ctx context.Context, _ int64) error {
	rep, err := m.a.kafkaPendingReport(ctx)
	if err != nil {
		return err
	}
	if m.a.json {
		return m.a.printJSON(rep)
	}
	m.a.printKafkaPending(rep)
	return nil
}

func (m kafkaMode) showQueue(ctx context.Context, d *taskDetail) {
	d.Kafka = m.a.kafkaTaskOf(ctx, d.Outbox)
}

func (m kafkaMode) demoServers(say func(string, ...any)) (string, func(), error) {
	stop, err := m.a.demoKafka(say)
	return "", stop, err
}

func (m kafkaMode) demoDLQ(ctx context.Context, _ redis.UniversalClient, ids []uuid.UUID) ([]dlq.Entry, error) {
	return m.a.demoKafkaDLQ(ctx, ids)
}

// demoCommands: none; the follow-up commands (pending, task show) show
// the group's view.
func (m kafkaMode) demoCommands(string, *demoSummary) []string { return nil }

func (m kafkaMode) demoEnv() string {
	return fmt.Sprintf("INGEST_DATABASE_URL='%s' INGEST_QUEUE=kafka KAFKA_BOOTSTRAP_SERVERS='%s'", redact.DSN(m.a.cfg.DatabaseURL), m.a.cfg.KafkaBrokers)
}

func (m kafkaMode) dlqName() string { return "topic " + m.a.cfg.KafkaDLQTopic }

// kafkaAdmin returns an admin client on the configured brokers.
func (a *app) kafkaAdmin() (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(a.cfg.kafkaBrokers()...), kgo.MetadataMinAge(time.Second))
	if err != nil {
		return nil, nil, usagef("KAFKA_BOOTSTRAP_SERVERS: %v", err)
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// kafkaPartitionLag is one partition of the Kafka view of `pending`.
type kafkaPartitionLag struct {
	Partition int32  `json:"partition"`
	Committed int64  `json:"committed"` // -1: nothing committed
	End       int64  `json:"end"`
	Lag       int64  `json:"lag"`
	Member    string `json:"member,omitempty"`
}

// kafkaPending is the Kafka view of `pending`: the group's lag per
// partition of the task topic.
type kafkaPending struct {
	Topic      string              `json:"topic"`
	Group      string              `json:"group"`
	State      string              `json:"state"`
	Members    int                 `json:"members"`
	TotalLag   int64               `json:"total_lag"`
	Partitions []kafkaPartitionLag `json:"partitions"`
}

func (a *app) kafkaPendingReport(ctx context.Context) (*kafkaPending, error) {
	adm, closeAdm, err := a.kafkaAdmin()
	if err != nil {
		return nil, err
	}
	defer closeAdm()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lags, err := adm.Lag(ctx, a.cfg.KafkaGroup)
	if err != nil {
		return nil, fmt.Errorf("kafka group lag: %w", err)
	}
	l, ok := lags[a.cfg.KafkaGroup]
	if !ok {
		return nil, fmt.Errorf("kafka group %s: no answer", a.cfg.KafkaGroup)
	}
	if err := errors.Join(l.DescribeErr, l.FetchErr); err != nil {
		return nil, fmt.Errorf("kafka group %s: %w", a.cfg.KafkaGroup, err)
	}
	r := &kafkaPending{Topic: a.cfg.KafkaTopic, Group: a.cfg.KafkaGroup, State: l.State, Members: len(l.Members), Partitions: []kafkaPartitionLag{}}
	for _, ml := range l.Lag[a.cfg.KafkaTopic] {
		p := kafkaPartitionLag{Partition: ml.Partition, Committed: ml.Commit.At, End: ml.End.Offset, Lag: ml.Lag}
		if ml.Member != nil {
			p.Member = ml.Member.ClientID
		}
		r.TotalLag += max(ml.Lag, 0)
		r.Partitions = append(r.Partitions, p)
	}
	sort.Slice(r.Partitions, func(i, j int) bool { return r.Partitions[i].Partition < r.Partitions[j].Partition })
	return r, nil
}

func (a *app) printKafkaPending(r *kafkaPending) {
	a.printf("topic %s, group %s (%s, %d members): lag %d\n\n", r.Topic, r.Group, r.State, r.Members, r.TotalLag)
	rows := make([][]string, 0, len(r.Partitions))
	for _, p := range r.Partitions {
		rows = append(rows, []string{fmt.Sprint(p.Partition), fmt.Sprint(p.Committed), fmt.Sprint(p.End), fmt.Sprint(p.Lag), p.Member})
	}
	a.table([]string{"PARTITION", "COMMITTED", "END", "LAG", "MEMBER"}, rows)
}

// kafkaRecord is the Kafka view of a task in `task show`: its latest
// record (from the outbox row's stream_id) and whether the group has
// committed past it.
type kafkaRecord struct {
	Position  string `json:"position"`
	Committed bool   `json:"committed"`
}

func (a *app) kafkaRecordOf(ctx context.Context, streamID string) (*kafkaRecord, error) {
	topic, p, off, err := kafka.ParsePosition(streamID)
	if err != nil {
		return nil, err
	}
	adm, closeAdm, err := a.kafkaAdmin()
	if err != nil {
		return nil, err
	}
	defer closeAdm()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	offs, err := adm.FetchOffsets(ctx, a.cfg.KafkaGroup)
	if err != nil {
		return nil, fmt.Errorf("kafka group %s offsets: %w", a.cfg.KafkaGroup, err)
	}
	r := &kafkaRecord{Position: streamID}
	if o, ok := offs.Lookup(topic, p); ok && o.Err == nil {
		r.Committed = o.At > off
	}
	return r, nil
}

// kafkaTaskView is the Kafka part of `task show`: the task's records (one
// per published outbox row) and whether the group has committed past each.
type kafkaTaskView struct {
	Topic   string        `json:"topic"`
	Group   string        `json:"group"`
	Records []kafkaRecord `json:"records"`
	Error   string        `json:"error,omitempty"`
}

func (a *app) kafkaTaskOf(ctx context.Context, rows []outboxRow) *kafkaTaskView {
	v := &kafkaTaskView{Topic: a.cfg.KafkaTopic, Group: a.cfg.KafkaGroup, Records: []kafkaRecord{}}
	for _, o := range rows {
		if o.StreamID == "" {
			continue
		}
		r, err := a.kafkaRecordOf(ctx, o.StreamID)
		if err != nil {
			v.Error = a.scrub.String(err.Error())
			return v
		}
		v.Records = append(v.Records, *r)
	}
	return v
}

func (a *app) printKafkaTask(v *kafkaTaskView) {
	a.printf("\nKAFKA (topic %s, group %s)\n", v.Topic, v.Group)
	if v.Error != "" {
		a.printf("  could not read Kafka: %s\n", v.Error)
		return
	}
	if len(v.Records) == 0 {
		a.printf("  no record yet (the outbox event is not published)\n")
		return
	}
	rows := make([][]string, len(v.Records))
	for i, r := range v.Records {
		rows[i] = []string{r.Position, yesNo(r.Committed)}
	}
	a.table([]string{"RECORD (topic/partition/offset)", "COMMITTED"}, rows)
}

// demoKafka starts an in-process Kafka cluster (kfake) for `demo --queue
// kafka`, unless KAFKA_BOOTSTRAP_SERVERS is set; stop closes it.
func (a *app) demoKafka(say func(string, ...any)) (stop func(), err error) {
	if a.setByUser("KAFKA_BOOTSTRAP_SERVERS") {
		say("Kafka:      %s\n", a.cfg.KafkaBrokers)
		return func() {}, nil
	}
	topics := []string{a.cfg.KafkaTopic}
	if a.cfg.KafkaDLQTopic != "" {
		topics = append(topics, a.cfg.KafkaDLQTopic)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topics...))
	if err != nil {
		return nil, fmt.Errorf("start the in-process Kafka: %w", err)
	}
	a.cfg.KafkaBrokers = strings.Join(c.ListenAddrs(), ",")
	say("Kafka:      in-process (kfake) on %s, topic %s (4 partitions)\n", a.cfg.KafkaBrokers, a.cfg.KafkaTopic)
	return c.Close, nil
}

// demoKafkaDLQ reads the DLQ topic's records of the demo's tasks.
func (a *app) demoKafkaDLQ(ctx context.Context, ids []uuid.UUID) ([]dlq.Entry, error) {
	out := []dlq.Entry{}
	if a.cfg.KafkaDLQTopic == "" {
		return out, nil
	}
	idSet := make(map[string]bool, len(ids))
	for _, id := range ids {
		idSet[id.String()] = true
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(a.cfg.kafkaBrokers()...), kgo.ConsumeTopics(a.cfg.KafkaDLQTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, a.cfg.KafkaDLQTopic)
	if err != nil {
		return nil, fmt.Errorf("dlq topic %s: %w", a.cfg.KafkaDLQTopic, err)
	}
	var want int64
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	var read int64
	for read < want && ctx.Err() == nil {
		f := cl.PollFetches(ctx)
		f.EachRecord(func(r *kgo.Record) {
			read++
			if e, err := kafka.DecodeDeadLetter(r); err == nil && idSet[e.TaskID] {
				out = append(out, e)
			}
		})
	}
	return out, nil
}
