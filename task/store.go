package task

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ingest-worker/ingest/internal/backoff"
	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/outbox"
	"github.com/ingest-worker/ingest/pgsession"
	"github.com/ingest-worker/ingest/seal"
	"github.com/ingest-worker/ingest/stream"
)

// DB is what the store runs statements on: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx all satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Defaults for Config.
const (
	DefaultStream          = stream.DefaultStream
	DefaultMaxAttempts     = 10
	DefaultMaxPayloadBytes = 1 << 20
	// DefaultMaxResultBytes bounds a handler's result
	// (INGEST_RESULT_MAX_BYTES): 1 MiB.
	DefaultMaxResultBytes = 1 << 20
	// MaxErrorBytes is the limit last_error and error_message are cut to
	// (at a rune boundary, so they stay valid UTF-8).
	MaxErrorBytes = clip.MaxErrorBytes
)

// Backoff is the retry delay policy of failed runs; package
// internal/backoff owns its formula, defaults and validation.
type Backoff = backoff.Policy

// DefaultBackoff is the policy used when none is configured.
var DefaultBackoff = backoff.Default

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
	// MaxAttempts is the limit of runs of the tasks that have none of their
	// own (created without max_attempts): the statements that record a
	// failed or abandoned run decide RETRYING or DEAD against it. So the
	// workers' setting (INGEST_REDIS_MAX_ATTEMPTS) governs such tasks, not
	// the setting of the process that created them.
	MaxAttempts int
	// MaxPayloadBytes bounds the size of a task's JSON payload.
	MaxPayloadBytes int
	// MaxResultBytes bounds the size of a handler's JSON result
	// (CheckResult); a larger one fails the run.
	MaxResultBytes int
	// Backoff is the retry delay policy of failed runs.
	Backoff Backoff
	// Keyring, when set, encrypts payloads and results at rest and opens
	// them when read (package seal; see encrypt.go). Nil: none are
	// encrypted, and those found encrypted are not opened.
	Keyring *seal.Keyring
	// Listen is where ListenCancels's connection comes from (the zero
	// value: a connection like the pool's); with Listen.None it returns
	// ErrNoListen at once.
	Listen pgsession.Source
}

// WithDefaults returns the configuration with every zero field set to
// its default.
func (c Config) WithDefaults() Config {
	c.Stream = cmp.Or(c.Stream, DefaultStream)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.MaxResultBytes = cmp.Or(c.MaxResultBytes, DefaultMaxResultBytes)
	c.Backoff = cmp.Or(c.Backoff, DefaultBackoff)
	return c
}

// Validate checks the configuration, zero fields taking their defaults,
// and names the bad field: "task: MaxAttempts: must be from 1 to 1000000,
// got 0".
func (c Config) Validate() error {
	c = c.WithDefaults()
	switch {
	case !MaxAttemptsRange.Contains(int64(c.MaxAttempts)):
		return configErr("MaxAttempts", "must be %s, got %d", MaxAttemptsRange.Text(), c.MaxAttempts)
	case !PayloadBytesRange.Contains(int64(c.MaxPayloadBytes)):
		return configErr("MaxPayloadBytes", "must be %s, got %d", PayloadBytesRange.Text(), c.MaxPayloadBytes)
	case !ResultBytesRange.Contains(int64(c.MaxResultBytes)):
		return configErr("MaxResultBytes", "must be %s, got %d", ResultBytesRange.Text(), c.MaxResultBytes)
	}
	return configWithin("Backoff", c.Backoff.Validate())
}

// Store reads and changes tasks in Postgres.
type Store struct {
	db  DB
	cfg Config
	// out writes the outbox rows of the tasks the store's own
	// transactions make due now (see PublishWith).
	out outbox.Writer
	// rated holds the kinds found with a rate limit by StartLimited.
	rated sync.Map
}

// Option changes how a Store works.
type Option func(*Store)

// PublishWith makes the store write the outbox rows of the tasks that its
// own transactions make due now (Create and CreateBatch, ReleaseParked)
// through w, and hand them to w's relay once each has committed: package
// outbox decides how (see outbox.Writer). Without it the store writes NEW
// rows, which a relay finds on the NOTIFY of the commit. NewService builds
// its store with a writer of the service's relay.
func PublishWith(w outbox.Writer) Option {
	return func(s *Store) { s.out = w }
}

// NewStore returns a store on db (usually a *pgxpool.Pool).
func NewStore(cfg Config, db DB, opts ...Option) (*Store, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err // "task: <Setting>: ..."
	}
	s := &Store{db: db, cfg: cfg}
	for _, o := range opts {
		o(s)
	}
	return s, nil
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
	// MaxAttempts is the task's own limit of runs; nil when it has none and
	// the MaxAttempts of the worker that records a failure applies (see
	// EffectiveMaxAttempts).
	MaxAttempts  *int       `json:"max_attempts"`
	NextRetryAt  *time.Time `json:"next_retry_at,omitempty"`
	LastError    string     `json:"last_error,omitempty"`
	ErrorMessage string     `json:"error_message,omitempty"`
	LeaseOwner   string     `json:"lease_owner,omitempty"`
	LeaseUntil   *time.Time `json:"lease_until,omitempty"`
	CreatedAt    time.Time  `json:"created_at"`
	UpdatedAt    time.Time  `json:"updated_at"`
	FinishedAt   *time.Time `json:"finished_at,omitempty"`
	// TimeoutMS is the task's own handler timeout (timeout_ms); 0: none
	// of its own, the worker's default applies.
	TimeoutMS int `json:"timeout_ms,omitempty"`
	// Priority is the task's priority, 1 (the highest) to 4; 2 is the
	// default (stored as NULL).
	Priority int `json:"priority"`
	// CancelRequestedAt, CancelReason and CancelRequestedBy record an
	// operator's cancel (Store.Cancel): set on a RUNNING task whose handler
	// is being cancelled, and kept on the CANCELLED task.
	CancelRequestedAt *time.Time `json:"cancel_requested_at,omitempty"`
	CancelReason      string     `json:"cancel_reason,omitempty"`
	CancelRequestedBy string     `json:"cancel_requested_by,omitempty"`
	// Traceparent is the W3C traceparent of the span the task was created
	// under (its publish and attempt spans' parent); "" when none.
	Traceparent string `json:"traceparent,omitempty"`
	// GroupKey is the task's group (a tenant, NewTask.GroupKey); "" when
	// it has none.
	GroupKey string `json:"group_key,omitempty"`
	// ParkedAt is when a worker parked the task (see Parked); nil when it
	// is not parked.
	ParkedAt *time.Time `json:"parked_at,omitempty"`
	// ParkedReason is why a parked task waits, ParkedPaused or ParkedLimit
	// (ParkReason of its kind's settings now), filled in by Get,
	// GetWithTransitions and List; "" otherwise.
	ParkedReason string `json:"parked_reason,omitempty"`
	// Result is the JSON the successful run returned (nil: none), and
	// Progress the latest progress of the current run (nil: none); both
	// are read by Get and GetWithTransitions only, not by List.
	Result   json.RawMessage `json:"result,omitempty"`
	Progress *Progress       `json:"progress,omitempty"`
	// WaitingFor is how many of the task's edges (dependencies, a
	// sequence predecessor) still hold it: a QUEUED task with WaitingFor
	// > 0 is held, never started until its release (deps.go).
	WaitingFor int `json:"waiting_for,omitempty"`
	// OnDependencyFailure is what a dependency ending DEAD or CANCELLED
	// does to the task: OnFailureCancel ("" means it) or OnFailureRun.
	OnDependencyFailure string `json:"on_dependency_failure,omitempty"`
	// WorkflowID is the id of the root task of the pipeline the task
	// belongs to; nil: none.
	WorkflowID *uuid.UUID `json:"workflow_id,omitempty"`
	// DependencyDepth is the length of the longest chain of dependencies
	// above the task; 0: it has none.
	DependencyDepth int `json:"dependency_depth,omitempty"`
	// SequenceKey is the task's sequence key ("" when in none) and
	// SequenceNo its place in that sequence, from 1 (see sequence.go).
	SequenceKey string `json:"sequence_key,omitempty"`
	SequenceNo  *int64 `json:"sequence_no,omitempty"`
	// PayloadEncrypted and ResultEncrypted are set, and Payload or Result
	// nil, when the stored value is encrypted under a key the store does
	// not hold or does not open under it (see Encrypted).
	PayloadEncrypted *Encrypted `json:"payload_encrypted,omitempty"`
	ResultEncrypted  *Encrypted `json:"result_encrypted,omitempty"`
}

// EffectiveMaxAttempts returns the task's own limit of runs, or workerMax
// (a worker's MaxAttempts) when it has none.
func (t Task) EffectiveMaxAttempts(workerMax int) int {
	if t.MaxAttempts != nil {
		return *t.MaxAttempts
	}
	return workerMax
}

// taskColumns are the columns scanTask reads, in order.
const taskColumns = `id, kind, payload, ` + taskColumnsAfterPayload

// taskColumnsNoPayload are taskColumns with a NULL payload, for the
// statements whose caller has the payload (a create) or uses none (a
// list, a cancel, the tasks a start or a limit did not start): a payload
// read back is sent by PostgreSQL and copied here for nothing, and a
// large one costs more than the rest of the row.
const taskColumnsNoPayload = `id, kind, NULL::jsonb, ` + taskColumnsAfterPayload

// taskColumnsAfterPayload are taskColumns after the payload.
const taskColumnsAfterPayload = `payload_sha, coalesce(idempotency_key, ''), status, attempt_count, max_attempts,
	next_retry_at, coalesce(last_error, ''), coalesce(error_message, ''), coalesce(lease_owner, ''), lease_until,
	created_at, updated_at, finished_at, cancel_requested_at, coalesce(cancel_reason, ''), coalesce(cancel_requested_by, ''),
	coalesce(traceparent, ''), coalesce(timeout_ms, 0), parked_at,
	coalesce(waiting_for, 0), coalesce(on_dependency_failure, ''), workflow_id, coalesce(dependency_depth, 0),
	coalesce(sequence_key, ''), sequence_no, coalesce(priority, 2), coalesce(group_key, '')`

// scanTask reads one row of taskColumns, then the extra destinations.
func scanTask(row pgx.Row, extra ...any) (Task, error) {
	return newTaskScanner(extra...).scan(row)
}

// taskScanner reads rows of taskColumns, then its extra destinations,
// through one set of destinations made once: each row of a batch
// allocates only what it holds, not a Task and 30-odd destinations of its
// own.
type taskScanner struct {
	t    Task
	dest []any
}

func newTaskScanner(extra ...any) *taskScanner {
	s := &taskScanner{}
	t := &s.t
	// The payload is read as bytes: PostgreSQL's jsonb text is valid
	// JSON, which a json.RawMessage destination would check again.
	s.dest = append(append(make([]any, 0, 30+len(extra)), &t.ID, &t.Kind, (*[]byte)(&t.Payload), &t.PayloadSHA, &t.IdempotencyKey, &t.Status, &t.AttemptCount,
		&t.MaxAttempts, &t.NextRetryAt, &t.LastError, &t.ErrorMessage, &t.LeaseOwner, &t.LeaseUntil,
		&t.CreatedAt, &t.UpdatedAt, &t.FinishedAt, &t.CancelRequestedAt, &t.CancelReason, &t.CancelRequestedBy, &t.Traceparent, &t.TimeoutMS, &t.ParkedAt,
		&t.WaitingFor, &t.OnDependencyFailure, &t.WorkflowID, &t.DependencyDepth,
		&t.SequenceKey, &t.SequenceNo, &t.Priority, &t.GroupKey), extra...)
	return s
}

// scan reads row and returns the task it holds; the extra destinations
// hold the row's extra columns until the next scan. The Task is cleared
// first, so that no field of the row before (a payload's bytes, which a
// scan may reuse) is shared with this one.
func (s *taskScanner) scan(row pgx.Row) (Task, error) {
	s.t = Task{}
	err := row.Scan(s.dest...)
	return s.t, err
}

// truncateError makes msg valid Postgres text of at most MaxErrorBytes.
func truncateError(msg string) string { return clip.Error(msg) }

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
