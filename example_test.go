package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	ingest "github.com/ingest-worker/ingest"
	"github.com/ingest-worker/ingest/task"
)

// A worker with one handler, and a task enqueued in the caller's own
// transaction together with its business data. (Compiled, not run: it needs
// servers.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("INGEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	// Defaults: stream ingest:tasks, group ingest-workers, 10 attempts.
	svc, err := ingest.NewService(ingest.Config{}, pool, ingest.Redis(rdb), slog.Default(), prometheus.NewRegistry())
	if err != nil {
		panic(err)
	}
	store := svc.Store()

	// Enqueue: the task commits (and is published) with the upload row, or
	// neither does.
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO upload (id, path) VALUES ($1, $2)`, 42, "/in/42.pdf"); err != nil {
		panic(err)
	}
	if _, err := store.CreateTx(ctx, tx, task.NewTask{
		Kind:           "ingest-pdf",
		Payload:        json.RawMessage(`{"upload_id": 42}`),
		IdempotencyKey: "upload-42", // a repeat returns the same task
	}); err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}

	// Work: register a handler per kind and run until SIGTERM.
	svc.Handle("ingest-pdf", func(ctx context.Context, t ingest.Task) error {
		var p struct {
			UploadID int `json:"upload_id"`
		}
		if err := json.Unmarshal(t.Payload, &p); err != nil {
			return ingest.Permanent(fmt.Errorf("bad payload: %w", err)) // DEAD at once
		}
		// ... do the work, idempotently, keyed by t.ID ...
		if p.UploadID == 0 {
			return errors.New("not ready yet") // RETRYING after the backoff
		}
		return nil // SUCCEEDED
	})
	if err := svc.Run(ctx); err != nil {
		panic(err)
	}
}
