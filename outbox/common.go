package outbox

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"

	"github.com/ingest-worker/ingest/internal/clip"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults shared by the components (DESIGN §4, §5).
const (
	// DefaultStream is the task stream (INGEST_REDIS_STREAM_KEY).
	DefaultStream = "ingest:tasks"
	// DefaultGroup is the workers' consumer group (INGEST_REDIS_GROUP).
	DefaultGroup = "ingest-workers"
	// NotifyChannel is the channel the outbox_event trigger NOTIFYs on
	// commit (migrations/00001_create_tables.sql).
	NotifyChannel = "ingest_outbox"
	// MaxErrorBytes is the limit last_error is cut to.
	MaxErrorBytes = 4096
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

func configErr(component, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, component, fmt.Sprintf(format, args...))
}

func discardIfNil(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// register registers c on reg and returns the collector to use: c, or the
// equal one registered before (several relays of one process share their
// metrics). A nil reg registers nothing.
func register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if reg == nil {
		return c, nil
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("register metrics: %w", err)
	}
	return c, nil
}

// truncateError makes msg valid Postgres text of at most MaxErrorBytes.
func truncateError(msg string) string { return clip.PGText(msg, MaxErrorBytes) }

// streamID is a parsed Redis stream entry id "ms-seq".
type streamID struct{ ms, seq uint64 }

func parseStreamID(s string) (streamID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		seq = "0"
	}
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if err1 != nil || err2 != nil {
		return streamID{}, fmt.Errorf("bad stream entry id %q", s)
	}
	return streamID{a, b}, nil
}

func (id streamID) String() string { return fmt.Sprintf("%d-%d", id.ms, id.seq) }

func (id streamID) less(o streamID) bool {
	return id.ms < o.ms || (id.ms == o.ms && id.seq < o.seq)
}

// next is the smallest id greater than id.
func (id streamID) next() streamID {
	if id.seq == math.MaxUint64 {
		return streamID{id.ms + 1, 0}
	}
	return streamID{id.ms, id.seq + 1}
}
