package task_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ingest-worker/ingest/internal/testenv"
	"github.com/ingest-worker/ingest/task"
	"github.com/ingest-worker/ingest/transition"
)

func TestSmokeLifecycle(t *testing.T) {
	ctx := context.Background()
	db := testenv.DB(t)
	s, err := task.NewStore(task.Config{MaxAttempts: 2, Backoff: task.Backoff{Base: time.Millisecond, Max: time.Millisecond}}, db)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Create(ctx, task.NewTask{Kind: "k", Payload: json.RawMessage(`{"b":1, "a":[1,2]}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := c.Task.ID
	r, err := s.Start(ctx, "w1", time.Minute, id)
	if err != nil || r[0].Outcome != task.Started {
		t.Fatalf("start: %+v %v", r, err)
	}
	f, err := s.Fail(ctx, "w1", task.Failure{ID: id, Error: "boom"})
	if err != nil || !f[0].Applied || f[0].Status != task.Retrying {
		t.Fatalf("fail: %+v %v", f, err)
	}
	time.Sleep(5 * time.Millisecond)
	r, _ = s.Start(ctx, "w2", time.Millisecond, id)
	if r[0].Outcome != task.Started {
		t.Fatalf("restart: %+v", r[0])
	}
	time.Sleep(5 * time.Millisecond)
	r, err = s.Start(ctx, "w3", time.Minute, id)
	if err != nil || !r[0].Died {
		t.Fatalf("takeover: %+v %v", r[0], err)
	}
	red, err := s.Redrive(ctx, "op", id)
	if err != nil || !red[0].Applied {
		t.Fatalf("redrive: %+v %v", red, err)
	}
	r, _ = s.Start(ctx, "w4", time.Minute, id)
	sc, err := s.Succeed(ctx, "w4", id)
	if err != nil || !sc[0].Applied {
		t.Fatalf("succeed %+v %v", sc, err)
	}
	recs, _ := transition.List(ctx, db, id)
	for _, rec := range recs {
		t.Logf("%s -> %s (%d) %s %s", rec.From, rec.To, rec.AttemptCount, rec.Worker, rec.Message)
	}
	tasks, next, err := s.List(ctx, task.ListParams{})
	t.Log(len(tasks), next, err, string(c.Task.Payload))
}
