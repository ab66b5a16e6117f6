package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ingest-worker/ingest/api"
	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/kafka"
	"github.com/ingest-worker/ingest/webhook"
)

// TestBinaryKafkaMode runs `ingest-worker run` with INGEST_QUEUE=kafka
// against an in-process Kafka cluster and no Redis: /readyz reports the
// brokers, tasks created over the API reach the webhook, a 4xx answer
// makes a task DEAD, and `pending` and `task show` give the Kafka view.
func TestBinaryKafkaMode(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, kafka.DefaultTopic, kafka.DefaultDLQTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	db := testenv.NewEmptyDatabase(t)
	rc, hook := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, req webhook.Request) {
		if req.Kind == "kafka.reject" {
			http.Error(w, "no such account", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	addr := freeAddr(t)
	env := []string{
		"INGEST_DATABASE_URL=" + db.URL, "INGEST_QUEUE=kafka", "KAFKA_BOOTSTRAP_SERVERS=" + strings.Join(c.ListenAddrs(), ","),
		"INGEST_REDIS_URL=redis://127.0.0.1:1/0", // unreachable: Kafka mode must not need it
		"INGEST_WEBHOOK_URL=" + hook.URL + "/hook", "INGEST_CONSUMER_NAME=k-" + uuid.NewString()[:8],
	}
	mustRun(t, bin, env, "", "migrate")
	worker := start(t, bin, env, "run", "--http-addr", addr)
	waitReady(t, worker, addr)
	code, body := apiCall(t, "GET", "http://"+addr+"/readyz", "", "")
	if code != http.StatusOK || !strings.Contains(string(body), `"kafka":"ok"`) {
		t.Fatalf("/readyz: %d %s, want the kafka check ok", code, body)
	}

	var ids []uuid.UUID
	for _, kind := range []string{"kafka.ok", "kafka.ok", "kafka.reject"} {
		code, body := apiCall(t, "POST", "http://"+addr+"/v1/tasks", "", `{"kind":"`+kind+`","payload":{}}`)
		var created api.CreateResponse
		if code != http.StatusCreated || json.Unmarshal(body, &created) != nil {
			t.Fatalf("create: %d %s", code, body)
		}
		ids = append(ids, created.ID)
	}
	testenv.Eventually(t, 30*time.Second, "all tasks finished", func() bool {
		var left int
		if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM ingest_task WHERE status NOT IN ('SUCCEEDED', 'DEAD')`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
	for i, id := range ids {
		if rc.count(id) != 1 {
			t.Errorf("task %d (%s) reached the webhook %d times, want 1", i, id, rc.count(id))
		}
	}
	var dead string
	if err := db.Pool.QueryRow(t.Context(), `SELECT status FROM ingest_task WHERE id = $1`, ids[2]).Scan(&dead); err != nil || dead != "DEAD" {
		t.Errorf("rejected task: %s %v, want DEAD", dead, err)
	}

	testenv.Eventually(t, 10*time.Second, "pending shows lag 0", func() bool {
		out := mustRun(t, bin, env, "", "pending", "--json")
		var rep kafkaPending
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("pending --json: %v\n%s", err, out)
		}
		return rep.Topic == kafka.DefaultTopic && len(rep.Partitions) == 3 && rep.TotalLag == 0
	})
	out := mustRun(t, bin, env, "", "task", "show", ids[0].String(), "--json")
	var d taskDetail
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("task show --json: %v\n%s", err, out)
	}
	if d.Kafka == nil || len(d.Kafka.Records) != 1 || !strings.HasPrefix(d.Kafka.Records[0].Position, kafka.DefaultTopic+"/") {
		t.Fatalf("task show: Kafka view %+v, want the task's one record", d.Kafka)
	}
	testenv.Eventually(t, 10*time.Second, "the record committed", func() bool {
		out := mustRun(t, bin, env, "", "task", "show", ids[0].String(), "--json")
		var d taskDetail
		return json.Unmarshal([]byte(out), &d) == nil && d.Kafka != nil && len(d.Kafka.Records) == 1 && d.Kafka.Records[0].Committed
	})
}
