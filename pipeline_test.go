package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// docSummary is the result of the test's document handler.
type docSummary struct {
	Pages int    `json:"pages"`
	Title string `json:"title"`
}

// TestResultAndProgressFromALibraryHandler runs a result handler that
// reports progress: the progress it reports while running is visible in
// the task, the last report survives the success, the result is stored by
// the success, and Service.Wait returns the task once it ended.
func TestResultAndProgressFromALibraryHandler(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	halfway := make(chan struct{})
	proceed := make(chan struct{})
	svc.HandleResult("doc", ingest.Returning(func(ctx context.Context, tk ingest.Task) (docSummary, error) {
		if err := tk.ReportProgress(101, ""); err == nil || !strings.Contains(err.Error(), "percent") {
			t.Errorf("ReportProgress(101) = %v, want an error naming percent", err)
		}
		if err := tk.ReportProgress(50, "page 5 of 10"); err != nil {
			t.Error(err)
		}
		close(halfway)
		<-proceed
		// A burst: only the last of it needs to reach the task.
		for p := 51; p <= 100; p++ {
			if err := tk.ReportProgress(p, "page "+strings.Repeat("i", p%7)); err != nil {
				t.Error(err)
			}
		}
		if err := tk.ReportProgress(100, "done"); err != nil {
			t.Error(err)
		}
		return docSummary{Pages: 10, Title: "<b>report</b>"}, nil
	}))
	res, err := b.store.Create(context.Background(), task.NewTask{Kind: "doc", Payload: json.RawMessage(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Task.ID
	<-halfway
	b.eventually(10*time.Second, "progress 50 visible", func() bool {
		got, err := b.store.Get(context.Background(), id)
		return err == nil && got.Progress != nil && got.Progress.Percent == 50 && got.Progress.Message == "page 5 of 10"
	})
	close(proceed)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := svc.Wait(ctx, id)
	if err != nil || got.Status != task.Succeeded {
		t.Fatalf("Wait = %s, %v; want SUCCEEDED", got.Status, err)
	}
	var sum docSummary
	if err := json.Unmarshal(got.Result, &sum); err != nil || sum != (docSummary{Pages: 10, Title: "<b>report</b>"}) {
		t.Errorf("result %s (%v), want the handler's summary", got.Result, err)
	}
	if got.Progress == nil || got.Progress.Percent != 100 || got.Progress.Message != "done" {
		t.Errorf("progress after success = %+v, want the last report (100, done)", got.Progress)
	}
}

// TestBadResultsFailTheRun checks that a result over the limit and one
// that is not JSON fail the run with an error saying so, and that a
// Handler (no result) still succeeds with none.
func TestBadResultsFailTheRun(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	cfg := b.store.Config()
	cfg.MaxResultBytes = 64
	store, err := task.NewStore(cfg, b.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	b.store = store
	svc := b.run(b.fastConfig("w1"), map[string]ingest.Handler{"plain": func(context.Context, ingest.Task) error { return nil }}, slog.LevelError)
	svc.HandleResult("big", func(context.Context, ingest.Task) (json.RawMessage, error) {
		return json.RawMessage(`"` + strings.Repeat("x", 100) + `"`), nil
	})
	svc.HandleResult("broken", func(context.Context, ingest.Task) (json.RawMessage, error) {
		return json.RawMessage(`{"a":`), nil
	})
	want := map[string]string{"big": "result is 102 bytes, the limit is 64", "broken": "result is not valid JSON", "plain": ""}
	ids := map[string]task.Task{}
	for kind := range want {
		res, err := store.Create(context.Background(), task.NewTask{Kind: kind, Payload: json.RawMessage(`{}`), MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		ids[kind] = res.Task
	}
	for kind, msg := range want {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got, err := svc.Wait(ctx, ids[kind].ID)
		cancel()
		switch {
		case err != nil:
			t.Errorf("%s: Wait: %v", kind, err)
		case msg == "" && (got.Status != task.Succeeded || got.Result != nil):
			t.Errorf("%s: %s with result %s, want SUCCEEDED without one", kind, got.Status, got.Result)
		case msg != "" && (got.Status != task.Dead || !strings.Contains(got.LastError, msg) || got.Result != nil):
			t.Errorf("%s: %s, last_error %q, result %s; want DEAD with %q", kind, got.Status, got.LastError, got.Result, msg)
		}
	}
}

// TestServiceWaitLatency logs how soon Service.Wait returns after a
// handler returns (the success's commit is between the two), and checks
// that a wait whose context ends first returns the running task with the
// context's error.
func TestServiceWaitLatency(t *testing.T) {
	t.Parallel()
	b := newServiceBundle(t)
	svc := b.run(b.fastConfig("w1"), nil, slog.LevelError)
	returned := make(chan time.Time, 1)
	release := make(chan struct{})
	svc.Handle("k", func(ctx context.Context, tk ingest.Task) error {
		<-release
		returned <- time.Now()
		return nil
	})
	var lat []time.Duration
	for i := range 10 {
		res, err := b.store.Create(context.Background(), task.NewTask{Kind: "k", Payload: json.RawMessage(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			b.eventually(10*time.Second, "running", func() bool {
				got, err := b.store.Get(context.Background(), res.Task.ID)
				return err == nil && got.Status == task.Running
			})
			// Long enough for the wait's first read on a slow machine: a
			// wait cut off before it returns no task.
			short, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			got, err := svc.Wait(short, res.Task.ID)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || got.Status != task.Running {
				t.Errorf("a wait that ends first = %s, %v; want RUNNING and DeadlineExceeded", got.Status, err)
			}
		}
		done := make(chan time.Time, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			got, err := svc.Wait(ctx, res.Task.ID)
			if err != nil || got.Status != task.Succeeded {
				t.Errorf("Wait = %s, %v", got.Status, err)
			}
			done <- time.Now()
		}()
		release <- struct{}{}
		at := <-returned
		lat = append(lat, (<-done).Sub(at))
	}
	slices.Sort(lat)
	t.Logf("handler returned → Service.Wait returned, %d tasks: p50 %s, max %s", len(lat), lat[len(lat)/2], lat[len(lat)-1])
}
