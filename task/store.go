package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/internal/defaults"
	"github.com/ingest-worker/ingest/outbox"
)

// DB is what the store runs statements on: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx all satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults for Config.
const (
	DefaultStream          = "ingest:tasks"
	DefaultMaxAttempts     = 10
	DefaultMaxPayloadBytes = 1 << 20
	// MaxErrorBytes is the limit last_error and error_message are cut to
	// (at a rune boundary, so they stay valid UTF-8).
	MaxErrorBytes = 4096
)

// Sentinel errors.
var (
	ErrNotFound        = errors.New("task not found")
	ErrInvalidTask     = errors.New("invalid task")
	ErrPayloadTooLarge = errors.New("payload too large")
)

// Config configures a Store. Zero fields take the Default* values.
type Config struct {
	// Stream is the Redis stream that outbox events of new tasks go to.
	Stream string
	// MaxAttempts is the max_attempts of tasks created without one.
	MaxAttempts int
	// MaxPayloadBytes bounds the size of a task's JSON payload.
	MaxPayloadBytes int
	// Backoff is the retry delay policy of failed runs.
	Backoff Backoff
}

func (c *Config) setDefaults() {
	defaults.Set(&c.Stream, DefaultStream)
	defaults.Set(&c.MaxAttempts, DefaultMaxAttempts)
	defaults.Set(&c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	defaults.Set(&c.Backoff, DefaultBackoff)
}

// Validate checks the configuration and names the bad field.
func (c Config) Validate() error {
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("MaxAttempts must be >= 1, got %d", c.MaxAttempts)
	case c.MaxPayloadBytes < 2:
		return fmt.Errorf("MaxPayloadBytes must be >= 2, got %d", c.MaxPayloadBytes)
	}
	if err := c.Backoff.Validate(); err != nil {
		return fmt.Errorf("Backoff: %w", err)
	}
	return nil
}

// Store reads and changes tasks in Postgres.
type Store struct {
	db    DB
	cfg   Config
	relay atomic.Pointer[outbox.Relay] // see PublishThrough
}

// NewStore returns a store on db (usually a *pgxpool.Pool).
func NewStore(cfg Config, db DB) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("task store config: %w", err)
	}
	return &Store{db: db, cfg: cfg}, nil
}

// Config returns the store's configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// Task is one row of ingest_task.
type Task struct {
	ID             uuid.UUID       `json:"id"`
	Kind           string          `json:"kind"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	PayloadSHA     string          `json:"payload_sha"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Status         State           `json:"status"`
	AttemptCount   int             `json:"attempt_count"`
	MaxAttempts    int             `json:"max_attempts"`
	NextRetryAt    *time.Time      `json:"next_retry_at,omitempty"`
	LastError      string          `json:"last_error,omitempty"`
	ErrorMessage   string          `json:"error_message,omitempty"`
	LeaseOwner     string          `json:"lease_owner,omitempty"`
	LeaseUntil     *time.Time      `json:"lease_until,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	UpdatedAt      time.Time       `json:"updated_at"`
	FinishedAt     *time.Time      `json:"finished_at,omitempty"`
}

// taskColumns are the columns scanTask reads, in order.
const taskColumns = `id, kind, payload, payload_sha, coalesce(idempotency_key, ''), status, attempt_count, max_attempts,
	next_retry_at, coalesce(last_error, ''), coalesce(error_message, ''), coalesce(lease_owner, ''), lease_until,
	created_at, updated_at, finished_at`

func scanTask(row pgx.Row, extra ...any) (Task, error) {
	var t Task
	dest := append([]any{&t.ID, &t.Kind, &t.Payload, &t.PayloadSHA, &t.IdempotencyKey, &t.Status, &t.AttemptCount,
		&t.MaxAttempts, &t.NextRetryAt, &t.LastError, &t.ErrorMessage, &t.LeaseOwner, &t.LeaseUntil,
		&t.CreatedAt, &t.UpdatedAt, &t.FinishedAt}, extra...)
	err := row.Scan(dest...)
	return t, err
}

// truncateError makes msg valid Postgres text of at most MaxErrorBytes.
func truncateError(msg string) string { return clip.PGText(msg, MaxErrorBytes) }

// inTx runs f in a transaction of s.db, retrying on deadlock or
// serialization failure (f must be safe to run again).
func (s *Store) inTx(ctx context.Context, f func(pgx.Tx) error) error {
	return s.retry(ctx, func() error { return pgx.BeginFunc(ctx, s.db, f) })
}

// retry runs f (a transaction or a single statement, which is one), again
// on deadlock or serialization failure, up to 5 times.
func (s *Store) retry(ctx context.Context, f func() error) error {
	for attempt := 1; ; attempt++ {
		err := f()
		var pgErr *pgconn.PgError
		if err != nil && attempt < 5 && ctx.Err() == nil && errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001") {
			continue
		}
		return err
	}
}
