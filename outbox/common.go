package outbox

import (
	"errors"
	"log/slog"

	"github.com/ingest-worker/ingest/internal/clip"
	"github.com/ingest-worker/ingest/internal/configerr"
	"github.com/ingest-worker/ingest/stream"
)

// Defaults shared by the components (docs/ARCHITECTURE.md §4, §5).
const (
	// DefaultStream is the task stream (INGEST_REDIS_STREAM_KEY).
	DefaultStream = stream.DefaultStream
	// DefaultGroup is the workers' consumer group (INGEST_REDIS_GROUP).
	DefaultGroup = stream.DefaultGroup
	// NotifyChannel is the channel the outbox_event trigger NOTIFYs on
	// commit (migrations/00001_create_tables.sql).
	NotifyChannel = "ingest_outbox"
	// MaxErrorBytes is the limit last_error is cut to.
	MaxErrorBytes = clip.MaxErrorBytes
)

// Status is the status of an outbox event (column outbox_event.status).
type Status string

const (
	// StatusNew: written by the creating transaction, not yet published.
	StatusNew Status = "NEW"
	// StatusRetrying: a publish failed; due again at next_retry_at.
	StatusRetrying Status = "RETRYING"
	// StatusSent: the entry is in the stream (stream_id, sent_at).
	StatusSent Status = "SENT"
	// StatusDead: publishing failed max-attempts times; the row stays for
	// forensics and is never published again.
	StatusDead Status = "DEAD"
)

// ErrConfig is wrapped by every configuration error of this package.
var ErrConfig = errors.New("invalid outbox config")

// configErr is the error of a bad field of RelayConfig, in the form
// package configerr owns: "outbox: BatchSize: must be ...".
func configErr(setting, format string, args ...any) error {
	return configerr.New("outbox", ErrConfig, setting, format, args...)
}

// configWithin is err, the error of a nested configuration (the backoff
// policy), as the error of RelayConfig's field prefix.
func configWithin(prefix string, err error) error {
	return configerr.Within("outbox", ErrConfig, prefix, err)
}

func discardIfNil(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// truncateError makes msg valid Postgres text of at most MaxErrorBytes.
func truncateError(msg string) string { return clip.PGText(msg, MaxErrorBytes) }
