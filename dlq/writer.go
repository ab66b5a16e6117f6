package dlq

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/internal/configerr"
	"github.com/ingest-worker/ingest/stream"

	"github.com/redis/go-redis/v9"
)

// DefaultStream is the default DLQ stream key (INGEST_REDIS_DLQ_STREAM_KEY,
// docs/ARCHITECTURE.md §5).
const DefaultStream = "ingest:tasks:dlq"

// MaxErrorBytes bounds last_error in a DLQ entry.
const MaxErrorBytes = clip.MaxErrorBytes

// DLQ entry field names (contract).
const (
	FieldTaskID       = "task_id"
	FieldKind         = "kind"
	FieldAttemptCount = "attempt_count"
	FieldLastError    = "last_error"
	FieldSourceID     = "source_id"
	FieldDeadAt       = "dead_at"
)

// Entry is one DLQ entry.
type Entry struct {
	// ID is the DLQ entry's id (set by List; ignored by Write).
	ID string `json:"id,omitempty"`
	// TaskID is the task id as the source entry had it: for a poison
	// message it may be empty or not a UUID.
	TaskID string `json:"task_id"`
	// Kind is the task's kind ("" when unknown).
	Kind string `json:"kind"`
	// AttemptCount is the task's attempt_count when it died.
	AttemptCount int `json:"attempt_count"`
	// LastError is why it died.
	LastError string `json:"last_error"`
	// SourceID is the task-stream entry id; for an entry of a priority
	// stream, qualified with its priority (stream.QualifyID: "p1/<id>").
	SourceID string `json:"source_id"`
	// DeadAt is when it was dead-lettered.
	DeadAt time.Time `json:"dead_at"`
	// Death, when set, identifies this death of the task (its id and time
	// of death): Write dead-letters each death at most once, however many
	// stream entries of the task carry it (a duplicate entry, or a
	// redelivery after a crash between the DEAD commit and the DLQ write).
	// Not stored in the entry.
	Death string `json:"-"`
}

// MarkerTTL is how long Write remembers a death it dead-lettered (see
// Entry.Death): far longer than any entry stays pending.
const MarkerTTL = 7 * 24 * time.Hour

func (e Entry) values() []any {
	return []any{
		FieldTaskID, e.TaskID,
		FieldKind, e.Kind,
		FieldAttemptCount, strconv.Itoa(e.AttemptCount),
		FieldLastError, clip.String(e.LastError, MaxErrorBytes),
		FieldSourceID, e.SourceID,
		FieldDeadAt, e.DeadAt.UTC().Format(time.RFC3339Nano),
	}
}

// Config names the keys a Writer works on.
type Config struct {
	// Stream is the task stream the source entries are in; required.
	Stream string
	// Group is the consumer group whose pending entries are acknowledged;
	// required.
	Group string
	// DLQ is the dead-letter stream key; "" writes no DLQ entries and only
	// acknowledges (DEAD state only). On Redis Cluster it must share the
	// task stream's hash tag.
	DLQ string
}

// Validate checks the configuration and names the bad field: "dlq:
// Stream: is required".
func (c Config) Validate() error {
	bad := func(setting, format string, args ...any) error {
		return configerr.New("dlq", nil, setting, format, args...)
	}
	switch {
	case c.Stream == "":
		return bad("Stream", "is required")
	case c.Group == "":
		return bad("Group", "is required")
	case c.DLQ != "" && c.DLQ == c.Stream:
		return bad("DLQ", "must differ from Stream (%q)", c.Stream)
	}
	return nil
}

//go:embed write.lua
var writeLua string

var writeScript = redis.NewScript(writeLua)

// Writer dead-letters task-stream entries.
type Writer struct {
	cfg Config
	rdb redis.UniversalClient
}

// NewWriter returns a writer for cfg.
func NewWriter(cfg Config, rdb redis.UniversalClient) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rdb == nil {
		return nil, errors.New("dlq: nil redis client")
	}
	if _, cluster := rdb.(*redis.ClusterClient); cluster && cfg.DLQ != "" {
		if tag := HashTag(cfg.Stream); tag == "" || tag != HashTag(cfg.DLQ) {
			return nil, fmt.Errorf("dlq config: invalid DLQ: on Redis Cluster %q must share a {hash tag} with Stream %q (the DLQ script writes both keys), for example {ingest}:tasks and {ingest}:tasks:dlq", cfg.DLQ, cfg.Stream)
		}
	}
	return &Writer{cfg: cfg, rdb: rdb}, nil
}

// HashTag returns the Redis Cluster hash tag of key, "" when it has none:
// the text between the first '{' and the first '}' after it, when not
// empty. Keys with the same tag are in the same slot.
func HashTag(key string) string { return stream.HashTag(key) }

// Enabled reports whether the writer writes DLQ entries (a DLQ key is
// configured).
func (w *Writer) Enabled() bool { return w.cfg.DLQ != "" }

// Write adds e to the DLQ and acknowledges its source entry e.SourceID,
// atomically. It returns the DLQ entry id, or "" when nothing was written:
// the source entry was no longer pending, or no DLQ is configured (then it
// only acknowledges). A zero e.DeadAt is now. On error nothing is
// acknowledged.
func (w *Writer) Write(ctx context.Context, e Entry) (string, error) {
	if e.SourceID == "" {
		return "", errors.New("dlq write: entry has no source id")
	}
	// A source entry of a priority stream has a qualified id
	// (stream.QualifyID), kept as it is in the DLQ entry's source_id.
	prio, sourceID := stream.SplitID(e.SourceID)
	src := stream.Key(w.cfg.Stream, prio)
	if !w.Enabled() {
		if err := w.rdb.XAck(ctx, src, w.cfg.Group, sourceID).Err(); err != nil {
			return "", fmt.Errorf("xack %s %s: %w", src, sourceID, err)
		}
		return "", nil
	}
	if e.DeadAt.IsZero() {
		e.DeadAt = time.Now()
	}
	args := append([]any{w.cfg.Group, sourceID, MarkerTTL.Milliseconds()}, e.values()...)
	keys := []string{src, w.cfg.DLQ}
	if e.Death != "" {
		// Derived from the DLQ key, so it shares its Cluster hash tag.
		keys = append(keys, w.cfg.DLQ+":death:"+e.Death)
	}
	id, err := writeScript.Run(ctx, w.rdb, keys, args...).Text()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("dead-letter %s %s to %s: %w", src, sourceID, w.cfg.DLQ, err)
	}
	return id, nil
}
