package kafka_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/task"
)

type outboxRow struct {
	status      string
	attempts    int
	nextRetryAt *time.Time
	lastError   string
	streamID    string
	sentAt      *time.Time
}

func outboxRows(t *testing.T, db *pgxpool.Pool, taskID uuid.UUID) []outboxRow {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT status, attempt_count, next_retry_at, coalesce(last_error, ''),
		coalesce(stream_id, ''), sent_at FROM outbox_event WHERE task_id = $1 ORDER BY id`, taskID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []outboxRow
	for rows.Next() {
		var r outboxRow
		if err := rows.Scan(&r.status, &r.attempts, &r.nextRetryAt, &r.lastError, &r.streamID, &r.sentAt); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

func newTask(t *testing.T, store *task.Store) uuid.UUID {
	t.Helper()
	res, err := store.Create(context.Background(), task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	return res.Task.ID
}

// TestRelayPublishesToKafka: the relay marks rows SENT with the record's
// position, and the record names the task.
func TestRelayPublishesToKafka(t *testing.T) {
	brokers := cluster(t, 2)
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{Stream: kafka.DefaultTopic}, db)
	if err != nil {
		t.Fatal(err)
	}
	id := newTask(t, store)
	relay, err := outbox.NewRelayWith(outbox.RelayConfig{}, db, kafka.NewPublisher(producer(t, brokers), 0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := relay.DrainOnce(context.Background())
	if err != nil || res.Published != 1 {
		t.Fatalf("DrainOnce = %+v, %v; want 1 published", res, err)
	}
	rows := outboxRows(t, db, id)
	if len(rows) != 1 || rows[0].status != "SENT" || rows[0].sentAt == nil {
		t.Fatalf("outbox rows %+v, want one SENT", rows)
	}
	topic, _, _, err := kafka.ParsePosition(rows[0].streamID)
	if err != nil || topic != kafka.DefaultTopic {
		t.Errorf("stream_id %q: want a position in %s (%v)", rows[0].streamID, kafka.DefaultTopic, err)
	}
}

// TestRelayUnreachableBrokerRetriesThenDead is the seed's reproduction
// with brokers at an unreachable port: the task stays QUEUED, its outbox
// row goes RETRYING with backoff, then DEAD with next_retry_at NULL; once a
// broker is reachable, a new outbox row for the task is published.
func TestRelayUnreachableBrokerRetriesThenDead(t *testing.T) {
	db := testenv.DB(t)
	store, err := task.NewStore(task.Config{Stream: kafka.DefaultTopic}, db)
	if err != nil {
		t.Fatal(err)
	}
	id := newTask(t, store)
	cl, err := kafka.NewProducerClient(kafka.Config{Brokers: []string{unreachable(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cfg := outbox.RelayConfig{MaxAttempts: 3, PublishTimeout: 200 * time.Millisecond,
		Backoff: backoff.Policy{Base: time.Millisecond, Max: 2 * time.Millisecond}}
	relay, err := outbox.NewRelayWith(cfg, db, kafka.NewPublisher(cl, 200*time.Millisecond), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sawRetrying bool
	for i := 0; i < 3; i++ {
		testenv.Eventually(t, 5*time.Second, "a due outbox row", func() bool {
			res, err := relay.DrainOnce(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return res.Claimed == 1
		})
		rows := outboxRows(t, db, id)
		if rows[0].attempts != i+1 || rows[0].lastError == "" {
			t.Fatalf("after attempt %d: %+v", i+1, rows[0])
		}
		if rows[0].status == "RETRYING" {
			sawRetrying = true
			if rows[0].nextRetryAt == nil {
				t.Fatalf("RETRYING row without next_retry_at: %+v", rows[0])
			}
		}
	}
	rows := outboxRows(t, db, id)
	if !sawRetrying || rows[0].status != "DEAD" || rows[0].nextRetryAt != nil || rows[0].sentAt != nil {
		t.Fatalf("after the last attempt: %+v (saw RETRYING: %v); want DEAD with next_retry_at NULL", rows[0], sawRetrying)
	}
	got, err := store.Get(context.Background(), id)
	if err != nil || got.Status != task.Queued {
		t.Fatalf("task %+v, %v; want QUEUED", got, err)
	}
}
